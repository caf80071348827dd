"""Lesson 02, exercise 1 (`exercises/02_collectives.ipynb`): `check_ring_reduce_scatter`,
rank r returns chunk r of the sum over ranks, from send/recv only (`rings.py` runs the ring and
holds the student to it). A wrong chunk is named with what it holds instead, and what that says
about the ring.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.collectives.cases import RING_CASES, drawn_ring_case
from dlcourse.checks.collectives.rings import (Case, check_ring, chunk_bounds, expect_chunks,
                                               holds, sizes, sum_of, whole_numbers, wide_case)
from dlcourse.checks.core import CHECK_TIMEOUT_S, describe, expect_unchanged, fresh_cases


REDUCE_SCATTER_HINT = ("n - 1 steps: at step k (0 to n - 2) rank r sends its partial sum of chunk "
                       "(r - k - 1) % n to rank r + 1, receives the partial of chunk "
                       "(r - k - 2) % n from rank r - 1 and adds its own copy of that chunk; "
                       "chunk r arrives last. Cut x with x.tensor_split(n)")


@fresh_cases
def check_ring_reduce_scatter(ring_reduce_scatter, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_reduce_scatter(x) must return, on rank r, chunk r of x.tensor_split(world_size)
    summed over every rank's x, from send/recv only, leaving x as it was."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in RING_CASES + [drawn_ring_case(rng), wide_case(rng)]:
        xs = [whole_numbers(shape, dtype, seed=rng.randrange(2**31)) for _ in range(n)]
        bounds = chunk_bounds(xs[0].numel(), n)
        where = (f"ring_reduce_scatter on {n} ranks, x: {describe(xs[0])} in chunks of "
                 f"{sizes(bounds)}")
        cases.append(Case(n, [(x,) for x in xs], where, bounds, steps=n - 1))
    check_ring(ring_reduce_scatter, cases, exercise="ring_reduce_scatter",
               reference=_torch_reduce_scatter, compare=_compare_reduce_scatter,
               hint=REDUCE_SCATTER_HINT, timeout=timeout)


def _torch_reduce_scatter(x):
    """The reference, in every rank: torch's reduce_scatter of x's chunks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.tensor_split(n))
    out = torch.empty_like(chunks[rank])
    dist.reduce_scatter(out, chunks)
    return out


def _compare_reduce_scatter(case, rank, got, args_after, expected):
    __tracebackhide__ = True
    x = case.rank_args[rank][0]
    start, stop = case.bounds[rank]
    expect_chunks(
        got, expected, case, rank=rank, verb="returned",
        chunk_of=lambda flat: (rank, f"elements {start} to {stop - 1} of x"),
        explain=lambda chunk: _explain_reduce_scatter(got, case, rank),
        shape_hint=(f"rank r returns chunk r of x.tensor_split(world_size): {x.numel()} "
                    f"elements on {case.world_size} ranks make chunks of {sizes(case.bounds)}, "
                    f"so rank {rank}'s has {stop - start}"))
    expect_unchanged(x, args_after[0], where=case.where, rank=rank, name="x",
                     hint="add into clones of x's chunks (chunk.clone()): like "
                          "dist.reduce_scatter, the function only reads its input")


def _explain_reduce_scatter(got, case, rank):
    inputs = [args[0] for args in case.rank_args]
    found = sum_of(got, inputs, case.bounds, first=rank)
    if found is None:
        return REDUCE_SCATTER_HINT
    c, k = found
    n = case.world_size
    held = f"rank {rank} holds {holds(c, k)}"
    if c != rank and all(m == 1 for m in k):
        return (f"{held}, not of chunk {rank}: the chunk indices are off by {(c - rank) % n}. "
                f"{REDUCE_SCATTER_HINT}")
    if c == rank and [q for q, m in enumerate(k) if m] == [rank]:
        return (f"{held}: nothing it received was added to chunk {rank}, so chunk {rank} did not "
                f"come round to it last; check the chunk indices. {REDUCE_SCATTER_HINT}")
    if c == rank and [q for q, m in enumerate(k) if not m] == [rank]:
        return (f"{held}: add its own copy to the last partial it receives, too. "
                f"{REDUCE_SCATTER_HINT}")
    if 2 in k:
        return (f"{held}: a partial that arrives already holds the sender's values; add only "
                f"your own copy, once. {REDUCE_SCATTER_HINT}")
    return f"{held}: a chunk must pass through all n ranks. {REDUCE_SCATTER_HINT}"
