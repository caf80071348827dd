"""Lesson 05, exercise 1 (`exercises/05_zero.ipynb`): `check_shard_of`, a rank's piece of the
parameters' flat buffer padded to a multiple of N, on real ranks, against the flat buffer sliced
in this process; every run holds a case where N does not divide Ψ.
"""

import math

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, dtype_name, expect_callable, expect_tensor,
                                  expect_unchanged, fresh_cases, random_tensor, run_on_ranks)
from dlcourse.checks.zero.answers import ANSWERS
from dlcourse.checks.zero.cases import draw_world_sizes, padded_shard, uneven
from dlcourse.checks.zero.in_rank import shard_in_rank


SHARD_HINT = ("flatten the parameters end to end (torch.cat of p.reshape(-1)), pad with zeros "
              "to N x s elements, s = ceil(Ψ / N), and return elements [r s, (r + 1) s) of it, "
              "with N = dist.get_world_size(group) and r = dist.get_rank(group)")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _shapes(rng, world_size, kind_):
    """Parameter shapes for one case. "tiny": Ψ = N + 1, so the last ranks hold mostly or only
    padding; "uneven": N does not divide Ψ; "any": whatever is drawn."""
    if kind_ == "tiny":
        return [(world_size + 1,)] if rng.random() < 0.5 else [(1,), (world_size,)]
    while True:
        shapes = [tuple(rng.randint(1, 7) for _ in range(rng.randint(1, 3)))
                  for _ in range(rng.randint(1, 4))]
        if kind_ == "any" or uneven(sum(math.prod(s) for s in shapes), world_size):
            return shapes


@fresh_cases
def check_shard_of(shard_of, timeout=CHECK_TIMEOUT_S, *, rng):
    """shard_of(params, group) must return this rank's shard of the parameters flattened end to
    end and padded with zeros to a multiple of the world size: ceil(Ψ / N) elements."""
    __tracebackhide__ = True
    expect_callable(shard_of, "shard_of")
    for world_size, kind_ in zip(draw_world_sizes(rng), ("uneven", "tiny", "any")):
        shapes, dtype = _shapes(rng, world_size, kind_), rng.choice(DTYPES)
        _check_shard_case(shard_of, world_size, shapes, dtype, rng.randrange(10**6), timeout)
    print("shard_of: passed on 3 cases (2, 3 and 4 ranks; Ψ = N + 1, Ψ not a multiple of N, "
          "any Ψ; float32, float64, bfloat16)")


def _check_shard_case(shard_of, world_size, shapes, dtype, data_seed, timeout):
    __tracebackhide__ = True
    params = [random_tensor(shape, dtype, data_seed + i) for i, shape in enumerate(shapes)]
    flat = torch.cat([p.reshape(-1) for p in params])
    psi, s = flat.numel(), -(-flat.numel() // world_size)
    where = (f"shard_of on {world_size} ranks, {dtype_name(dtype)} parameters of shapes "
             f"{', '.join(map(str, shapes))} (Ψ = {psi}, s = {s})")
    outcomes = run_on_ranks(shard_of, [(params,)] * world_size, exercise="shard_of", where=where,
                            hint=SHARD_HINT, harness=shard_in_rank, guard=ANSWERS.in_rank,
                            timeout=timeout)
    for rank, ((got, after), _) in enumerate(outcomes):
        for i, (before, p) in enumerate(zip(params, after)):
            expect_unchanged(before, p, where=where, rank=rank, name=f"parameter {i}",
                             hint="return a new tensor; leave the parameters as they are")
        expected = padded_shard(flat, world_size, rank)
        hint = _shard_hint(got, expected, params, flat, world_size, rank)
        expect_tensor(got, expected, where=where, rank=rank, hint=hint)


def _shard_hint(got, expected, params, flat, world_size, rank):
    """Which mistake gives `got`, if it is one we know."""
    if not isinstance(got, torch.Tensor) or got.dim() != 1:
        return SHARD_HINT
    psi, s = flat.numel(), expected.numel()
    f = psi // world_size
    if got.numel() == f != s and torch.equal(got, flat[rank * f:(rank + 1) * f].to(got.dtype)):
        return (f"Ψ // N rounds down: the last {psi % world_size} elements would belong to no "
                f"rank. Round up, s = ceil(Ψ / N) = {s}, and pad")
    if got.numel() != s and got.numel() == flat.tensor_split(world_size)[rank].numel():
        return (f"the shards of the unpadded buffer differ in size (Ψ = {psi} is not a multiple "
                f"of N = {world_size}): pad with zeros to N x s first, so every rank holds "
                f"s = {s} and collectives see equal pieces")
    by_parameter = torch.cat([p.reshape(-1) for p in params[rank::world_size]] or [flat[:0]])
    if got.numel() == by_parameter.numel() and torch.equal(got, by_parameter.to(got.dtype)):
        return ("this rank got whole parameters (like torch's ZeroRedundancyOptimizer): ZeRO "
                "cuts the one flat buffer at equal offsets, through parameters, so every rank "
                f"holds exactly s = {s} elements. " + SHARD_HINT)
    own = max(0, min(s, psi - rank * s))  # this shard's elements that are not padding
    if got.shape == expected.shape and torch.equal(got[:own], expected[:own]):
        return (f"the last {s - own} elements are padding, past the end of the parameters: "
                "they must be zeros (torch.zeros, not torch.empty), so that they add nothing "
                "when gradients are summed and never leak into a parameter")
    return SHARD_HINT
