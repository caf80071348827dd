"""Lesson 02's ring exercises (`exercises/02_collectives.ipynb`): the ring, by hand.

    check_ring_reduce_scatter(ring_reduce_scatter)  rank r returns chunk r of the sum over ranks
    check_ring_all_gather(ring_all_gather)          every rank returns every chunk, in rank order
    check_ring_all_reduce(ring_all_reduce)          every rank's tensor becomes the sum, in place

The ring checks run the student's function on 4, 3 and 2 real gloo ranks, on lengths that the
world size does not divide (and shorter than it), in float32 and float64, and compare every
rank's result with torch's own collective on the same inputs (and one case of chunks of 2 KiB or
more, `rings.wide_case`, where the bytes each rank received, counted outside it, are bounded
both ways). `rings.py` runs them and holds the student to a ring: send/recv only (torch's
collectives and the course's own rings refused), to one neighbour and from the other, a chunk
per step. A wrong chunk is named with what it holds
instead, and what that says about the ring.
"""


import torch
import torch.distributed as dist

from dlcourse.checks.core import (
    CHECK_TIMEOUT_S, describe, dtype_name, expect_unchanged, fail, fresh_cases, kind,
)
from dlcourse.checks.collectives.rings import (
    Case, check_ring, chunk_bounds, expect_chunks, holds, in_flat, join, sizes, sum_of,
    whole_numbers, wide_case,
)

# (world_size, shape, dtype): the lesson's 4 ranks with even chunks first, then chunks of unequal
# size (tensor_split makes the first numel % n one element longer), fewer elements than ranks
# (an empty chunk), and 2 ranks, where the left and the right neighbour are the same rank.
RING_CASES = [
    (4, (12,), torch.float32),  # chunks of 3, 3, 3, 3
    (4, (10,), torch.float64),  # 3, 3, 2, 2
    (3, (7,), torch.float32),  # 3, 2, 2
    (2, (5,), torch.float64),  # 3, 2
    (4, (3,), torch.float32),  # 1, 1, 1, 0
    (3, (2,), torch.float64),  # 1, 1, 0
]
# all-reduce takes any shape, as dist.all_reduce does: a gradient is often a matrix.
ALL_REDUCE_CASES = RING_CASES + [(4, (2, 5), torch.float64)]

REDUCE_SCATTER_HINT = ("n - 1 steps: at step k (0 to n - 2) rank r sends its partial sum of chunk "
                       "(r - k - 1) % n to rank r + 1, receives the partial of chunk "
                       "(r - k - 2) % n from rank r - 1 and adds its own copy of that chunk; "
                       "chunk r arrives last. Cut x with x.tensor_split(n)")
ALL_GATHER_HINT = ("put your own chunk in its place first; then n - 1 steps: at step k rank r "
                   "sends chunk (r - k) % n to rank r + 1 and receives chunk (r - k - 1) % n "
                   "from rank r - 1, into its place. Cut torch.empty(numel) with tensor_split(n)")
ALL_REDUCE_HINT = ("all-reduce is a reduce-scatter, then an all-gather of the complete chunks, "
                   "on the flattened tensor (tensor.view(-1)); then write the result into tensor "
                   "in place (tensor.copy_), as dist.all_reduce does")



def _drawn_ring_case(rng, matrix=False):
    """(world_size, shape, dtype) at random: 2-4 ranks, 1-20 elements (a matrix if asked)."""
    n, dtype = rng.randint(2, 4), rng.choice((torch.float32, torch.float64))
    if matrix:
        return n, (rng.randint(1, 4), rng.randint(1, 5)), dtype
    return n, (rng.randint(1, 20),), dtype


# ---------------------------------------------------------------- exercise 1: reduce-scatter

@fresh_cases
def check_ring_reduce_scatter(ring_reduce_scatter, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_reduce_scatter(x) must return, on rank r, chunk r of x.tensor_split(world_size)
    summed over every rank's x, from send/recv only, leaving x as it was."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in RING_CASES + [_drawn_ring_case(rng), wide_case(rng)]:
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


# ---------------------------------------------------------------- exercise 2: all-gather

@fresh_cases
def check_ring_all_gather(ring_all_gather, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_all_gather(chunk, numel) must return, on every rank, the numel elements whose chunk c
    (of tensor_split(world_size)) is rank c's chunk, from send/recv only, leaving chunk as is."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in RING_CASES + [_drawn_ring_case(rng), wide_case(rng)]:
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


# ---------------------------------------------------------------- exercise 3: all-reduce

@fresh_cases
def check_ring_all_reduce(ring_all_reduce, timeout=CHECK_TIMEOUT_S, *, rng):
    """ring_all_reduce(tensor) must make every rank's tensor the sum of all ranks' tensors, in
    place like dist.all_reduce, for any shape, from send/recv only."""
    __tracebackhide__ = True
    cases = []
    for n, shape, dtype in ALL_REDUCE_CASES + [_drawn_ring_case(rng, matrix=True),
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
