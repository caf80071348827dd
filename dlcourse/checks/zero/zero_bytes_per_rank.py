"""Lesson 05, exercise 4 (`exercises/05_zero.ipynb`): `check_zero_bytes_per_rank`, the exact
model-state bytes one rank holds, padding included, against the storages a rank allocates,
counted (`measured_bytes`); lesson 01's `model_state_bytes` is refused meanwhile.
"""

import math
import numbers
from collections.abc import Mapping

import torch

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.zero.answers import ANSWERS
from dlcourse.memory import storage_bytes


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
