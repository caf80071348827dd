"""Lesson 02, exercise 2 (`exercises/02_collectives.ipynb`): `check_ring_all_gather`, every rank
returns every chunk, in rank order, from send/recv only (`rings.py` runs the ring). A wrong chunk
is named with the chunk it holds instead.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.collectives.cases import RING_CASES, drawn_ring_case
from dlcourse.checks.collectives.rings import (Case, check_ring, chunk_bounds, expect_chunks,
                                               in_flat, join, sizes, whole_numbers, wide_case)
from dlcourse.checks.core import CHECK_TIMEOUT_S, dtype_name, expect_unchanged, fresh_cases


ALL_GATHER_HINT = ("put your own chunk in its place first; then n - 1 steps: at step k rank r "
                   "sends chunk (r - k) % n to rank r + 1 and receives chunk (r - k - 1) % n "
                   "from rank r - 1, into its place. Cut torch.empty(numel) with tensor_split(n)")


@fresh_cases
def check_ring_all_gather(ring_all_gather, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_all_gather(chunk, numel) must return, on every rank, the numel elements whose chunk c
    (of tensor_split(world_size)) is rank c's chunk, from send/recv only, leaving chunk as is."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in RING_CASES + [drawn_ring_case(rng), wide_case(rng)]:
        whole = whole_numbers(shape, dtype, seed=rng.randrange(2**31))
        bounds = chunk_bounds(whole.numel(), n)
        where = (f"ring_all_gather(chunk, numel={whole.numel()}) on {n} ranks, "
                 f"{dtype_name(dtype)} chunks of {sizes(bounds)}")
        rank_args = [(c.clone(), whole.numel()) for c in whole.tensor_split(n)]
        cases.append(Case(n, rank_args, where, bounds, steps=n - 1))
    check_ring(ring_all_gather, cases, exercise="ring_all_gather", reference=_torch_all_gather,
               compare=_compare_all_gather, hint=ALL_GATHER_HINT, timeout=timeout)


def _torch_all_gather(chunk, numel):
    """The reference, in every rank: torch's all_gather of the ranks' chunks."""
    n = dist.get_world_size()
    lengths = [len(c) for c in torch.arange(numel).tensor_split(n)]
    # gloo gathers tensors of one size only: pad each chunk to the longest, cut the padding off.
    padded = torch.zeros(max(lengths), dtype=chunk.dtype)
    padded[: len(chunk)] = chunk
    gathered = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:length] for g, length in zip(gathered, lengths)])


def _compare_all_gather(case, rank, got, args_after, expected):
    __tracebackhide__ = True
    chunk, numel = case.rank_args[rank]
    expect_chunks(
        got, expected, case, rank=rank, verb="returned",
        chunk_of=in_flat(case.bounds, "the result"),
        explain=lambda c: _explain_all_gather(got, expected, case, rank),
        shape_hint=(f"return all {numel} elements: chunks of {sizes(case.bounds)}, not "
                    f"world_size copies of your own chunk's size"))
    expect_unchanged(chunk, args_after[0], where=case.where, rank=rank, name="chunk",
                     hint="send your chunk as it is; it is the caller's")


def _explain_all_gather(got, expected, case, rank):
    n, bounds = case.world_size, case.bounds
    got = got.reshape(-1)
    wrong = [c for c, (a, b) in enumerate(bounds) if not torch.equal(got[a:b], expected[a:b])]
    if wrong == [rank]:
        return (f"only rank {rank}'s own chunk is wrong: no message brings it back, so copy it "
                f"into its place before the first step. {ALL_GATHER_HINT}")
    for c in wrong:  # does chunk c's place hold another rank's chunk?
        a, b = bounds[c]
        for q, (qa, qb) in enumerate(bounds):
            if q != c and b > a and qb - qa == b - a and torch.equal(got[a:b], expected[qa:qb]):
                return (f"on rank {rank} the place of chunk {c} holds chunk {q}: the chunk "
                        f"indices are off by {(q - c) % n}. {ALL_GATHER_HINT}")
    return (f"on rank {rank} chunks {join(wrong)} hold no rank's chunk: were they received "
            f"into? {ALL_GATHER_HINT}")
