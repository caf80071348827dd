"""How lesson 05's checks (`dlcourse/checks/zero/`) draw their cases, and the references they share.

Each check draws its cases from the `rng` that `core.fresh_cases` seeds afresh on every run (a
failure names the seed; `seed=` replays it), so a student cannot tabulate the answers. Every run
covers the edge cases: 2, 3 and 4 ranks, and a first case where N does not divide Ψ with at
least two elements of padding (`uneven`). Models are an MLP or the course GPT of random small
sizes, tied or not, in float64 so that a proof is exact up to rounding; a rank builds them
with `in_rank.py`'s `build`, re-exported here with `loss_fn` and `flat_of`.
"""

import torch

from dlcourse.checks.zero.in_rank import build, flat_of, loss_fn  # noqa: F401
from dlcourse.models import GPTConfig, MLPConfig, synthetic_regression, synthetic_tokens


def draw_world_sizes(rng):
    """2, 3 and 4 in a random order, 3 or 4 first: the first case is the uneven one."""
    first = rng.choice((3, 4))
    rest = [n for n in (2, 3, 4) if n != first]
    rng.shuffle(rest)
    return [first, *rest]


def draw_cases(rng, n_params):
    """(world_size, model spec) for 2, 3 and 4 ranks, one at a time (a check draws more of a
    case from `rng` before the next): the first uneven, its model redrawn until N does not divide
    the `n_params(spec)` elements the case shards."""
    for i, world_size in enumerate(draw_world_sizes(rng)):
        spec = draw_model(rng)
        while i == 0 and not uneven(n_params(spec), world_size):
            spec = draw_model(rng)
        yield world_size, spec


def uneven(n_params, world_size):
    """N does not divide Ψ and the padding is at least 2 elements, so padding put anywhere but
    the end of the buffer (each shard padded on its own, say) lands inside a parameter."""
    return 1 <= n_params % world_size <= world_size - 2


def padded_shard(flat, world_size, rank):
    """Rank `rank`'s shard of `flat` padded with zeros to a multiple of world_size: (s,), with
    s = ceil(numel / world_size). The reference the checks share."""
    s = -(-flat.numel() // world_size)
    padded = torch.zeros(world_size * s, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return padded[rank * s:(rank + 1) * s]


# float64 gradients summed over ranks in another order than one process's matmul differ by
# ~1e-16 relative (values below 10 here): 1e-12 leaves a thousand times that.
GRAD_ATOL = 1e-12


# ---------------------------------------------------------------- models drawn per case

def draw_model(rng):
    """("MLP" or "GPT", config) of random small sizes."""
    if rng.random() < 0.5:
        return "MLP", MLPConfig(d_in=rng.randint(2, 6), hidden=rng.randint(2, 8),
                                n_layers=rng.randint(1, 2), d_out=rng.randint(1, 4))
    heads = rng.randint(1, 2)
    return "GPT", GPTConfig(vocab_size=rng.randint(5, 16), seq_len=rng.randint(2, 5),
                            n_layers=2, n_heads=heads, hidden=heads * rng.randint(2, 4),
                            bias=rng.random() < 0.5, tie_embeddings=rng.random() < 0.5)


def wide_model(rng):
    """A GPT of 2 heads, h 12 to 16 (Ψ 3,600 to 5,300 drawn; its last block 1,800 to 3,200):
    a case whose float64 shards, ~2 KiB or more from each rank on 4 ranks, stand clear of
    gloo's headers in the bytes a rank received (counted outside it, `core.received`)."""
    return "GPT", GPTConfig(vocab_size=rng.randint(5, 16), seq_len=rng.randint(2, 5), n_layers=2,
                            n_heads=2, hidden=2 * rng.randint(6, 8), bias=rng.random() < 0.5,
                            tie_embeddings=rng.random() < 0.5)


def data(spec, n, seed):
    kind, config = spec
    if kind == "MLP":
        return tuple(t.to(torch.float64) for t in synthetic_regression(n, config, seed))
    return synthetic_tokens(n, config, seed)


def describe_model(spec):
    kind, c = spec
    if kind == "MLP":
        return f"MLP {c.d_in}-{'-'.join([str(c.hidden)] * c.n_layers)}-{c.d_out}"
    return (f"GPT h={c.hidden}, {c.n_heads} heads, V={c.vocab_size}, T={c.seq_len}, "
            f"bias={c.bias}, {'tied' if c.tie_embeddings else 'untied'}")


def gradient(spec, weights, x, y):
    """One process: {name: gradient} of the mean loss of (x, y) at `weights`."""
    model = build(spec)
    model.load_state_dict(weights, strict=False)  # a tied weight is listed once
    loss_fn(spec)(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}
