"""Lesson 05's shard and bytes checks (the set's guide is `__init__.py`)."""

import math
import numbers
from collections.abc import Mapping

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, call_in_process, dtype_name, expect_callable,
                                  expect_tensor, expect_unchanged, fail, fresh_cases, kind,
                                  random_tensor, run_on_ranks)
from dlcourse.checks.zero.answers import ANSWERS
from dlcourse.checks.zero.in_rank import shard_in_rank
from dlcourse.checks.zero.cases import draw_world_sizes, padded_shard, uneven
from dlcourse.memory import model_state_bytes, storage_bytes



# ---------------------------------------------------------------- exercise 1: the shard

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


# ---------------------------------------------------------------- exercise 4: bytes per rank

PARTS = ("params", "grads", "optimizer")
# (bytes of a parameter, of a gradient, of optimizer state per parameter): the optimizer holds
# fp32 master weights, Adam's momentum and variance in mixed precision (K = 12), the last two
# in plain fp32 (K = 8). Written as the tensors a rank allocates, for the measured reference.
HELD = {True: {"params": [torch.bfloat16], "grads": [torch.bfloat16],
               "optimizer": [torch.float32] * 3},
        False: {"params": [torch.float32], "grads": [torch.float32],
                "optimizer": [torch.float32] * 2}}
STAGE_PARTS = {0: (), 1: ("optimizer",), 2: ("optimizer", "grads"),
               3: ("optimizer", "grads", "params")}
BYTES_HINT = ("a part the stage partitions is one shard of the flat buffer padded to a multiple "
              "of N: ceil(Ψ / N) elements on every rank; a part it does not partition is all Ψ")
SIZES = (2, 3, 4, 5, 6, 7, 8, 16, 64)


@fresh_cases
def check_zero_bytes_per_rank(zero_bytes_per_rank, *, rng):
    """zero_bytes_per_rank(n_params, world_size, stage, mixed_precision) must return the exact
    bytes one rank holds, {"params", "grads", "optimizer"}, with partitioned parts padded."""
    __tracebackhide__ = True
    expect_callable(zero_bytes_per_rank, "zero_bytes_per_rank")
    cases = [(stage, mixed) for stage in STAGE_PARTS for mixed in (True, False)]
    rng.shuffle(cases)
    for i, (stage, mixed) in enumerate(cases):
        world_size = rng.choice(SIZES)
        n_params = rng.randrange(world_size + 1, 2 * 10**6)
        if i and n_params % world_size == 0:  # all but the first: N does not divide Ψ
            n_params += rng.randrange(1, world_size)
        _check_bytes_case(zero_bytes_per_rank, n_params, world_size, stage, mixed)
    print(f"zero_bytes_per_rank: passed on {len(cases)} cases (stages 0-3, mixed precision "
          "and fp32, 2 to 64 ranks, Ψ not a multiple of N), equal to the bytes of the tensors a "
          "rank allocates")


# the library's answers and lesson 01's formula refused
BYTES_ANSWERS = ANSWERS.but(single=(("dlcourse.memory", "model_state_bytes"),))


def _check_bytes_case(fn, n_params, world_size, stage, mixed):
    __tracebackhide__ = True
    where = (f"zero_bytes_per_rank(n_params={n_params:,}, world_size={world_size}, "
             f"stage={stage}, mixed_precision={mixed})")
    got = call_in_process(fn, (n_params, world_size, stage, mixed), exercise="zero_bytes_per_rank",
                          where=where, guard=BYTES_ANSWERS.in_process, hint=BYTES_HINT)
    got = _as_parts(got, where)
    for part in PARTS:
        want = measured_bytes(n_params, world_size, part, part in STAGE_PARTS[stage], mixed)
        value = got[part]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            fail(where, None, f"{part} is {kind(value)}, expected a number of bytes", BYTES_HINT)
        if value != want:
            fail(where, None, f"{part} is {value:,} bytes per rank, expected {want:,}",
                 _bytes_hint(part, value, n_params, world_size, stage, mixed))


def measured_bytes(n_params, world_size, part, partitioned, mixed):
    """Bytes of the tensors one rank holds of `part`: allocated (uninitialised) and counted."""
    numel = -(-n_params // world_size) if partitioned else n_params
    held = [torch.empty(numel, dtype=d) for d in HELD[mixed][part]]  # all alive at once
    return storage_bytes(held)


def _as_parts(got, where):
    __tracebackhide__ = True
    if not isinstance(got, Mapping) or any(part not in got for part in PARTS):
        fail(where, None, f"returned {kind(got)}, expected a dict with the keys 'params', "
                          "'grads' and 'optimizer'", "return {'params': ..., 'grads': ..., "
                                                     "'optimizer': ...}, bytes on one rank")
    return got


def _bytes_hint(part, got, n_params, world_size, stage, mixed):
    """Name the mistake that gives `got`, from the bytes per element of this part."""
    per = measured_bytes(1, 1, part, False, mixed)  # bytes per element of this part
    psi, N = n_params, world_size
    partitioned = part in STAGE_PARTS[stage]
    if partitioned and math.isclose(got, per * psi / N):
        return (f"that is Ψ / N elements, right only when N divides Ψ: {psi:,} / {N} is not "
                "whole. Every rank holds a whole shard, ceil(Ψ / N), the last one padded")
    if partitioned and got == per * (psi // N):
        return (f"Ψ // N rounds down: the last {psi % N} elements would belong to no rank. "
                "Round up: ceil(Ψ / N) elements on every rank, padding included")
    if not partitioned and got in (per * -(-psi // N), per * psi / N):
        return f"stage {stage} does not partition the {part}: every rank holds all Ψ of them"
    if partitioned and got == per * psi:
        return (f"stage {stage} partitions the {part}: each rank holds one shard, "
                "ceil(Ψ / N) elements")
    if not partitioned and got == per * N * -(-psi // N):
        return ("the padding belongs to the flat buffer a stage shards; a part kept whole is "
                "the model's own tensors, Ψ elements")
    return BYTES_HINT + f" (here {per} bytes per element of the {part})"
