"""Lesson 02, exercise 3 (`exercises/02_collectives.ipynb`): `check_ring_all_reduce`, every
rank's tensor becomes the sum over ranks, in place, for any shape, from send/recv only
(`rings.py` runs the ring). A wrong chunk is named with what it holds instead, and which phase
that points at.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.collectives.cases import RING_CASES, drawn_ring_case
from dlcourse.checks.collectives.rings import (Case, check_ring, chunk_bounds, expect_chunks,
                                               holds, in_flat, sizes, sum_of, whole_numbers,
                                               wide_case)
from dlcourse.checks.core import CHECK_TIMEOUT_S, describe, fail, fresh_cases, kind


# all-reduce takes any shape, as dist.all_reduce does: a gradient is often a matrix.
ALL_REDUCE_CASES = RING_CASES + [(4, (2, 5), torch.float64)]


ALL_REDUCE_HINT = ("all-reduce is a reduce-scatter, then an all-gather of the complete chunks, "
                   "on the flattened tensor (tensor.view(-1)); then write the result into tensor "
                   "in place (tensor.copy_), as dist.all_reduce does")


@fresh_cases
def check_ring_all_reduce(ring_all_reduce, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_all_reduce(tensor) must make every rank's tensor the sum of all ranks' tensors, in
    place like dist.all_reduce, for any shape, from send/recv only."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in ALL_REDUCE_CASES + [drawn_ring_case(rng, matrix=True),
                                             wide_case(rng, least=3)]:
        xs = [whole_numbers(shape, dtype, seed=rng.randrange(2**31)) for _ in range(n)]
        bounds = chunk_bounds(xs[0].numel(), n)
        flat = ", flattened," if len(shape) > 1 else ""
        where = (f"ring_all_reduce on {n} ranks, tensor: {describe(xs[0])}{flat} in chunks of "
                 f"{sizes(bounds)}")
        cases.append(Case(n, [(x,) for x in xs], where, bounds, steps=2 * (n - 1)))
    check_ring(ring_all_reduce, cases, exercise="ring_all_reduce", reference=_torch_all_reduce,
               compare=_compare_all_reduce, hint=ALL_REDUCE_HINT, timeout=timeout)


def _torch_all_reduce(tensor):
    """The reference, in every rank: torch's all_reduce of a copy of tensor."""
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def _compare_all_reduce(case, rank, returned, args_after, expected):
    __tracebackhide__ = True
    before, after = case.rank_args[rank][0], args_after[0]
    if torch.equal(after, before):
        gave = "" if returned is None else f" (your function returned {kind(returned)})"
        fail(case.where, rank, f"left tensor as it was{gave}: all-reduce works in place",
             "write the sum into the caller's tensor with tensor.copy_(...), as dist.all_reduce "
             "does; `tensor = ...` only rebinds a name inside your function")
    expect_chunks(after, expected, case, rank=rank, verb="left",
                  chunk_of=in_flat(case.bounds, "the flattened tensor"),
                  explain=lambda c: _explain_all_reduce(after, expected, case, rank, c),
                  shape_hint=ALL_REDUCE_HINT)


def _explain_all_reduce(after, expected, case, rank, c):
    n, numel = case.world_size, expected.numel()
    wrong = (after != expected).reshape(-1).nonzero().flatten()
    if numel % n and wrong.min() >= numel - numel % n:
        return (f"only the last {numel % n} elements are wrong, the numel % n that chunks of "
                f"numel // n = {numel // n} leave out; tensor_split(n) makes the first "
                f"numel % n chunks one element longer. {ALL_REDUCE_HINT}")
    if torch.allclose(after * n, expected, rtol=1e-6):  # a mean has fractions: not exact
        return ("that is the mean over the ranks, not the sum: dist.all_reduce sums by default "
                "(ReduceOp.SUM); data parallel divides by n itself (lesson 03)")
    inputs = [args[0] for args in case.rank_args]
    start, stop = case.bounds[c]
    found = sum_of(after.reshape(-1)[start:stop], inputs, case.bounds, first=c)
    if found is None:
        return ALL_REDUCE_HINT
    held, k = found
    words = f"on rank {rank} chunk {c} holds {holds(held, k)}"
    if held != c and all(m == 1 for m in k):
        return (f"{words}: the phases disagree about which chunk is complete. After the "
                f"reduce-scatter rank r holds the complete chunk r, and the all-gather starts "
                f"by sending it. {ALL_REDUCE_HINT}")
    if held == c and c != rank:
        return (f"{words}: after the reduce-scatter only chunk r is complete on rank r; the "
                f"all-gather phase brings the other n - 1 complete chunks. {ALL_REDUCE_HINT}")
    if held == c:
        return (f"{words}: the reduce-scatter must leave chunk r complete on rank r, and the "
                f"all-gather starts by sending it on, never receiving it. {ALL_REDUCE_HINT}")
    return f"{words}. {ALL_REDUCE_HINT}"
