"""Lesson 00, exercise 2 (`exercises/00_launch.ipynb`): `check_sum_to_rank0`, rank 0 gets the sum
over ranks and the others get None, from one dist.reduce, compared with a single-process `.sum`.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.core import (CHECK_TIMEOUT_S, describe, expect_none, expect_tensor,
                                  expect_unchanged, fresh_cases, random_tensor, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.launch.cases import WIDE_CASE, describe_cases, drawn_case


# (world_size, shape of x, dtype); each run adds one drawn at random (`cases.drawn_case`)
SUM_CASES = [(4, (5,), torch.float32), (3, (2, 3), torch.int64), (2, (7,), torch.float64)]


# Tolerances for a sum over ranks: gloo adds the ranks' tensors in its own order, the reference
# in torch.sum's. Each float32 addition rounds at ~6e-8 of the running sum (|sum| < 10 here), so
# a few additions differ by ~1e-6 at most; 1e-5 allows that and nothing a real mistake (a
# missing rank moves the sum by ~1) could hide behind. Integers add exactly.
SUM_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


SUM_HINT = "reduce a clone of x with dist.reduce(..., dst=0) and return it on rank 0 only"


@fresh_cases
def check_sum_to_rank0(sum_to_rank0, timeout=CHECK_TIMEOUT_S, *, rng):
    """sum_to_rank0(x) must return the elementwise sum of every rank's x on rank 0 and None on
    the other ranks, with one dist.reduce (not all_reduce), leaving the caller's x unchanged."""
    __tracebackhide__ = True
    cases = SUM_CASES + [drawn_case(rng), WIDE_CASE]
    for world_size, shape, dtype in cases:
        xs = [random_tensor(shape, dtype, seed=rng.randrange(2**31)) for _ in range(world_size)]
        where = f"sum_to_rank0 on {world_size} ranks, x: {describe(xs[0])}"
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(
            sum_to_rank0, [(x,) for x in xs], exercise="sum_to_rank0", where=where, hint=SUM_HINT,
            forbid=("all_reduce",),
            why_forbidden="it gives every rank the sum, and only rank 0 needs it here. Use "
                          "dist.reduce(..., dst=0), which sends the result to rank 0 alone.",
            timeout=timeout, received=received)
        tol = SUM_TOLERANCE.get(dtype, 0.0)
        expected = torch.stack(xs).sum(dim=0)  # (*shape), same dtype as x
        for rank, (got, (x_after,)) in enumerate(outcomes):
            if rank == 0:
                expect_tensor(got, expected, where=where, rank=0, atol=tol, rtol=tol,
                              tolerance=f"{tol:g} (summation order)" if tol else "",
                              hint=SUM_HINT)
            else:
                expect_none(got, where=where, rank=rank,
                            hint="only rank 0 returns the sum; every other rank returns None")
            expect_unchanged(xs[rank], x_after, where=where, rank=rank, name="x",
                             hint="dist.reduce works in place on the tensor it is given: "
                                  "reduce a clone of x, not x itself")
        most = torch_received(_reduce, [(torch.zeros_like(xs[0]),)] * world_size)
        expect_received_data(received, most, where, SUM_HINT)
    print(f"sum_to_rank0: passed on {describe_cases(cases)}")


def _reduce(x, way):
    """torch's own reduce of every rank's x to rank 0: the bound on what sum_to_rank0 receives."""
    dist.reduce(x, dst=0)
