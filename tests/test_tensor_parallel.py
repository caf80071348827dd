"""Lesson 04's layer proofs on real gloo ranks: every tensor-parallel layer, forward and backward,
equals the plain layer it replaces in one process (every rank's output, every gradient gathered),
for tp = 2 and 4, with and without bias, in float64; and the trap of building g on torch's
differentiable all-reduce (every gradient behind it tp times too large).

One launch of 4 ranks runs every case: tp = 4 on the whole job and tp = 2 on RankGrid(dp=2, tp=2)'s
two groups. Tolerance: float64, where a sum over 2 or 4 ranks adds the same numbers in another
order than one matmul does: ~1e-16 relative, so 1e-12 (a bias added on every rank or a missing
all-reduce is off by O(1)).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import dlcourse
from dlcourse.models import Block, GPTConfig
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor import (ColumnParallelLinear, RowParallelLinear,
                                      VocabParallelEmbedding, check_tp, g_trap, sequence_shard,
                                      unshard, vocab_parallel_cross_entropy)
from dlcourse.parallel.tensor.parallelize import parallel_block

TOL = 1e-12
B, T, H, OUT, V = 2, 8, 16, 24, 32


def err(a, b):
    return (a - b).abs().max().item()


def whole_grad(p, group):
    """The whole gradient of a parameter: sharded ones gathered from every rank's shard."""
    if not hasattr(p, "tp_dim"):
        return p.grad
    shards = [torch.empty_like(p.grad) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, p.grad.contiguous(), group=group)
    return unshard(shards, p.tp_dim, p.tp_parts)


def whole_sequence(x, group):
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=1)


def leaf(x, group=None, sp=False):
    """A fresh leaf: x itself, or this rank's sequence shard of it."""
    return (sequence_shard(x, group) if sp else x).detach().clone().requires_grad_()


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def compare(run_ref, run_tp, x, group, sp, params):
    """Run the reference and the parallel version on x, backward sum(out^2) on both; return the
    error of the output, of the input's gradient and of each (reference, parallel) parameter."""
    x_ref, x_tp = leaf(x), leaf(x, group, sp)
    want, got = run_ref(x_ref), run_tp(x_tp)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()  # on a sequence shard: this rank's part of the same sum
    out = {"output": err(whole_sequence(got, group) if sp else got, want),
           "input grad": err(x_tp.grad, leaf(x_ref.grad, group, sp))}
    for name, (ref, mine) in params.items():
        out[f"{name} grad"] = err(whole_grad(mine, group), ref.grad)
    return out


def linear_pair(group, bias, sp):
    """Column then row, as the MLP pairs them, against two nn.Linear."""
    ref_in, ref_out = nn.Linear(H, OUT, bias=bias).double(), nn.Linear(OUT, H, bias=bias).double()
    col = ColumnParallelLinear(ref_in, group, sequence_parallel=sp)
    row = RowParallelLinear(ref_out, group, sequence_parallel=sp)
    params = {"column weight": (ref_in.weight, col.weight), "row weight": (ref_out.weight, row.weight)}
    if bias:
        params |= {"column bias": (ref_in.bias, col.bias), "row bias": (ref_out.bias, row.bias)}
    return compare(lambda x: ref_out(F.gelu(ref_in(x))), lambda x: row(F.gelu(col(x))),
                   randn(B, T, H, seed=1), group, sp, params)


def column_gathered(group, bias):
    """The seed's picture: each rank computes out/t columns, an all-gather joins them."""
    ref = nn.Linear(H, OUT, bias=bias).double()
    col = ColumnParallelLinear(ref, group, gather_output=True)
    params = {"weight": (ref.weight, col.weight)} | ({"bias": (ref.bias, col.bias)} if bias else {})
    return compare(ref, col, randn(B, T, H, seed=2), group, False, params)


def embedding(group, sp):
    ref = nn.Embedding(V, H).double()
    emb = VocabParallelEmbedding(ref, group, sequence_parallel=sp)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    want, got = ref(ids), emb(ids)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    return {"output": err(whole_sequence(got, group) if sp else got, want),
            "weight grad": err(whole_grad(emb.weight, group), ref.weight.grad)}


def cross_entropy(group):
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    logits = randn(B * T, V, seed=4) * 3
    targets = torch.randint(0, V, (B * T,), generator=torch.Generator().manual_seed(5))
    whole, mine = leaf(logits), leaf(logits.chunk(t, dim=1)[rank])  # this rank's V/t columns
    want, got = F.cross_entropy(whole, targets), vocab_parallel_cross_entropy(mine, targets, group)
    want.backward()
    got.backward()
    return {"loss": err(got, want), "logits grad": err(mine.grad, whole.grad.chunk(t, 1)[rank])}


def block(group, bias, sp):
    """A whole transformer block (attention heads split, qkv cut per q, k, v; MLP) vs `Block`."""
    cfg = GPTConfig(vocab_size=V, seq_len=T, n_layers=1, n_heads=4, hidden=H, bias=bias)
    ref = Block(cfg).double()
    for p in ref.parameters():  # random LayerNorm and biases too, so each one is tested
        p.data.copy_(randn(*p.shape, seed=p.numel()) * 0.3)
    mine = parallel_block(ref, group, sp)
    pairs = dict(zip(dict(ref.named_parameters()), mine.parameters()))
    params = {name: (p_ref, pairs[name]) for name, p_ref in ref.named_parameters()}
    return compare(ref, mine, randn(B, T, H, seed=6), group, sp, params)


def trap(group):
    """Column, then row with g_trap in place of g: the forward is right, every gradient is t x."""
    ref_in, ref_out = nn.Linear(H, OUT).double(), nn.Linear(OUT, H, bias=False).double()
    col, row = ColumnParallelLinear(ref_in, group), RowParallelLinear(ref_out, group)
    x = randn(B, T, H, seed=7)
    want = ref_out(F.gelu(ref_in(x)))
    got = g_trap(F.linear(F.gelu(col(x)), row.weight), group)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    ratio = whole_grad(col.weight, group) / ref_in.weight.grad
    return {"output": err(got, want), "ratio": (ratio.min().item(), ratio.max().item())}


def every_case():
    """{(case, tp): {what: max error}} on this rank, for tp = 4 and tp = 2."""
    torch.manual_seed(0)  # nn.Linear's init: the same reference weights on every rank
    groups = {4: dist.group.WORLD, 2: RankGrid(dp=2, tp=2).new_groups().tp}
    out = {}
    for tp, group in groups.items():
        for bias in (True, False):
            for sp in (False, True):
                out[f"linear pair bias={bias} sp={sp}", tp] = linear_pair(group, bias, sp)
                out[f"block bias={bias} sp={sp}", tp] = block(group, bias, sp)
            out[f"column gathered bias={bias}", tp] = column_gathered(group, bias)
        for sp in (False, True):
            out[f"embedding sp={sp}", tp] = embedding(group, sp)
        out["cross entropy", tp] = cross_entropy(group)
        out["trap", tp] = trap(group)
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(every_case, world_size=4, backend="gloo")


CASES = [f"{kind} bias={bias} sp={sp}" for kind in ("linear pair", "block")
         for bias in (True, False) for sp in (False, True)]
CASES += [f"column gathered bias={b}" for b in (True, False)]
CASES += ["embedding sp=False", "embedding sp=True", "cross entropy"]


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("case", CASES)
def test_layer_equals_the_plain_layer_forward_and_backward(results, case, tp):
    for rank, errors in enumerate(results):
        for what, error in errors[case, tp].items():
            assert error <= TOL, f"rank {rank}, {case}, tp {tp}: {what} off by {error:.1e}"


def test_block_checks_every_parameter(results):
    names = [k for k in results[0]["block bias=True sp=True", 4] if k.endswith("grad")]
    assert len(names) == 1 + 12  # the input, and ln1, qkv, proj, ln2, fc, proj (weight and bias)


@pytest.mark.parametrize("tp", [2, 4])
def test_g_on_torch_differentiable_all_reduce_scales_gradients_by_tp(results, tp):
    for errors in results:
        assert errors["trap", tp]["output"] <= TOL  # the forward is right...
        low, high = errors["trap", tp]["ratio"]
        assert abs(low - tp) < 1e-9 and abs(high - tp) < 1e-9  # ...every gradient is tp x


@pytest.mark.parametrize("tp, sp, words", [
    (3, False, "tp 3 does not divide n_heads 4 (4 / 3 = 1.33333)"),
    (8, False, "tp 8 does not divide n_heads 4"),
    (2, True, "tp 2 does not divide seq_len 7 (7 / 2 = 3.5)"),
])
def test_sizes_that_do_not_divide_are_refused_with_the_arithmetic(tp, sp, words):
    cfg = GPTConfig(vocab_size=32, seq_len=7 if sp else 8, n_heads=4, hidden=16)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_tp(cfg, tp, sequence_parallel=sp)
