"""Checks for lesson 00's exercises (`exercises/00_launch.ipynb`): a first collective by hand.

    check_gather_all(gather_all)       every rank gets every rank's tensor, stacked in rank order
    check_sum_to_rank0(sum_to_rank0)   rank 0 gets the sum over ranks, the others get None

Each runs the student's function on real ranks (`core.run_on_ranks`) for inputs the notebook
never shows: other world sizes, odd shapes, integer and float dtypes. The reference is plain
single-process torch (`torch.stack`, `.sum`), so it shares no code with a solution. What each
rank received, counted by the kernel outside it, is bounded by what torch's own all_gather or
reduce of the same tensors receives (`core.received`): an all-reduce where a gather or a reduce
belongs fails in the case of 8 KiB a rank, whatever the student's process says.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.core import (
    CHECK_TIMEOUT_S, describe, dtype_name, expect_none, expect_tensor, expect_unchanged,
    fresh_cases, random_tensor, run_on_ranks,
)
from dlcourse.checks.core.received import expect_received_data, torch_received

# (world_size, shape of x, dtype): an odd world size, odd lengths, and an integer dtype, so a
# function that assumes 4 ranks, a flat x, or float32 buffers fails somewhere. Each run adds a
# case drawn at random (`_drawn_case`), and every tensor's values are drawn afresh.
GATHER_CASES = [(4, (3,), torch.float32), (3, (2, 5), torch.int64), (2, (7,), torch.float64)]
SUM_CASES = [(4, (5,), torch.float32), (3, (2, 3), torch.int64), (2, (7,), torch.float64)]
# And one case of 8 KiB a rank (issue 36): what each rank received, counted by the kernel
# outside it (`core.received`), is bounded by what torch's own all_gather or reduce of the same
# tensors receives; tensors of a few bytes would hide any excess under gloo's message headers.
WIDE_CASE = (4, (1024,), torch.float64)
DTYPES = (torch.float32, torch.float64, torch.int64)

# Tolerances for a sum over ranks: gloo adds the ranks' tensors in its own order, the reference
# in torch.sum's. Each float32 addition rounds at ~6e-8 of the running sum (|sum| < 10 here), so
# a few additions differ by ~1e-6 at most; 1e-5 allows that and nothing a real mistake (a
# missing rank moves the sum by ~1) could hide behind. Integers add exactly.
SUM_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}

GATHER_HINT = ("make a list of world_size tensors shaped like x with x's dtype "
               "(torch.empty_like), fill it with one dist.all_gather, and torch.stack it: "
               "row r is rank r's x")
SUM_HINT = "reduce a clone of x with dist.reduce(..., dst=0) and return it on rank 0 only"


@fresh_cases
def check_gather_all(gather_all, timeout=CHECK_TIMEOUT_S, *, rng):
    """gather_all(x) must return, on every rank, the (world_size, *x.shape) stack of every
    rank's x in rank order, and leave x as it was."""
    __tracebackhide__ = True
    cases = GATHER_CASES + [_drawn_case(rng), WIDE_CASE]
    for world_size, shape, dtype in cases:
        xs = [random_tensor(shape, dtype, seed=rng.randrange(2**31)) for _ in range(world_size)]
        where = f"gather_all on {world_size} ranks, x: {describe(xs[0])}"
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(gather_all, [(x,) for x in xs], exercise="gather_all",
                                where=where, hint=GATHER_HINT, timeout=timeout,
                                received=received)
        expected = torch.stack(xs)  # (world_size, *shape)
        for rank, (got, (x_after,)) in enumerate(outcomes):
            expect_tensor(got, expected, where=where, rank=rank, hint=GATHER_HINT)
            expect_unchanged(xs[rank], x_after, where=where, rank=rank, name="x", hint=GATHER_HINT)
        most = torch_received(_all_gather, [(torch.zeros_like(xs[0]),)] * world_size)
        expect_received_data(received, most, where, GATHER_HINT)
    print(f"gather_all: passed on {_cases(cases)}")


@fresh_cases
def check_sum_to_rank0(sum_to_rank0, timeout=CHECK_TIMEOUT_S, *, rng):
    """sum_to_rank0(x) must return the elementwise sum of every rank's x on rank 0 and None on
    the other ranks, with one dist.reduce (not all_reduce), leaving the caller's x unchanged."""
    __tracebackhide__ = True
    cases = SUM_CASES + [_drawn_case(rng), WIDE_CASE]
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
    print(f"sum_to_rank0: passed on {_cases(cases)}")


def _all_gather(x, way):
    """torch's own all_gather of every rank's x: the bound on what gather_all receives."""
    dist.all_gather([torch.empty_like(x) for _ in range(dist.get_world_size())], x)


def _reduce(x, way):
    """torch's own reduce of every rank's x to rank 0: the bound on what sum_to_rank0 receives."""
    dist.reduce(x, dst=0)


def _drawn_case(rng):
    """(world_size, shape, dtype) at random: 2-4 ranks, 1-3 dimensions of 1-6 elements."""
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
    return rng.randint(2, 4), shape, rng.choice(DTYPES)


def _cases(cases):
    return "; ".join(f"{ws} ranks, {dtype_name(dtype)} {tuple(shape)}"
                     for ws, shape, dtype in cases)
