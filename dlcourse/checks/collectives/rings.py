"""Running a ring exercise of lesson 02 on real ranks, and saying what a wrong chunk holds.

The three ring checks (`ring_reduce_scatter.py`, `ring_all_gather.py`, `ring_all_reduce.py`)
build their cases as `Case`s and hand them to `check_ring`, which runs the student's function on
each (send/recv only, see below), runs torch's own collective on the same inputs in a launch of
its own, and compares every rank's outcome with torch's.

Send/recv only: while the student's function runs, torch's collectives raise (`forbid=` of
`core.run_on_ranks`), and a `CommCounter` records what it sends. The course's own
`ring_all_reduce` is built from send/recv, so `forbid` alone would let it through; the counter
sees it as one record, an all_reduce by "ring", and any record but a send or a recv fails.
And a ring: the counter's sends and recvs must go one way round (to one neighbour, from the
other) and carry no more than the ring's steps of one chunk each, so that a right answer reached
through rank 0, or by passing whole tensors round, does not pass as a ring. What each rank
received is counted by the kernel too, outside it (`core.run_on_ranks(received=)`):
no less than the ring's steps of the shortest chunk (data moved by a file fails) and no more
than its steps of the longest and gloo's headers (whole tensors passed round, with the counter's
records cleared, fail); `wide_case` gives each check chunks of `WIRE_FLOOR` bytes or more, so
that these counts stand clear of the headers.

Inputs are whole numbers, so that a sum is exact in any order and a wrong chunk can be recognised
as a sum of some ranks' chunks (`sum_of`): a rank missing, a chunk off by one, a phase left out.
"""

import itertools
from dataclasses import dataclass

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.checks.collectives.answers import ANSWERS
from dlcourse.checks.collectives.in_rank import WHY_SEND_RECV, sends_and_recvs_only
from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, expect_callable,
                                  expect_tensor, fail, run_on_ranks)
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, wire_floor_units

# float32 holds whole numbers exactly up to 2^24 and float64 up to 2^53: values below 2^20 and
# 2^40 keep a sum of 4 ranks exact in its own dtype (so results must equal torch's bit for bit,
# with no tolerance to explain), and a float64 value does not fit in float32, so that a buffer
# of the wrong dtype shows.
MAGNITUDE = {torch.float32: 2**20, torch.float64: 2**40}

HANG_HINT = ("in a ring rank r sends only to (r + 1) % n and receives only from (r - 1) % n, "
             "one message each per step. dist.send waits until its receiver calls recv, so if "
             "every rank sends first, every rank waits: start the send with dist.isend, then "
             "dist.recv, then wait on the send")
RING_HINT = ("in a ring rank r sends only to rank (r + 1) % n and receives only from rank "
             "(r - 1) % n (or all the other way round), one chunk per step")
DTYPE_HINT = ("make every buffer with the input's dtype (torch.empty_like, or dtype=x.dtype): "
              "torch.empty(n) alone is float32")


@dataclass
class Case:
    """One input the student never saw: what each rank gets, and how messages name it."""

    world_size: int
    rank_args: list  # rank_args[r]: the arguments of rank r's call; the first is the tensor
    where: str  # the case, as messages name it
    bounds: list  # (start, stop) of chunk c in the flattened tensor
    steps: int  # steps of the ring: n - 1 for one phase, 2(n - 1) for an all-reduce

    def most_bytes(self):
        """What a rank of the ring sends at most: one chunk, of the longest size, per step."""
        longest = max(stop - start for start, stop in self.bounds)
        return self.steps * longest * self.rank_args[0][0].element_size()

    def least_bytes(self):
        """What a rank of the ring receives at least: one chunk, of the shortest size, a step."""
        shortest = min(stop - start for start, stop in self.bounds)
        return self.steps * shortest * self.rank_args[0][0].element_size()


def wide_case(rng, least=2):
    """(world_size, shape, dtype) whose every chunk is WIRE_FLOOR bytes or more, uneven, on
    `least` to 4 ranks (an all-reduce asks 3: on 2 a ring moves a whole tensor each way, as
    sending it whole does, so only 3 or more tell them apart)."""
    n, dtype = rng.randint(least, 4), rng.choice((torch.float32, torch.float64))
    size = torch.empty((), dtype=dtype).element_size()
    return n, (n * wire_floor_units(size) + rng.randrange(n),), dtype


def whole_numbers(shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    m = MAGNITUDE[dtype]
    return torch.randint(-m, m, shape, generator=generator).to(dtype)


def chunk_bounds(numel, world_size):
    """(start, stop) of each chunk when tensor_split cuts numel elements into world_size."""
    sizes = [len(c) for c in torch.arange(numel).tensor_split(world_size)]
    starts = itertools.accumulate([0] + sizes[:-1])
    return [(start, start + size) for start, size in zip(starts, sizes)]


def sizes(bounds):
    """'3, 3, 2, 2': the chunk sizes, as messages print them."""
    return ", ".join(str(stop - start) for start, stop in bounds)


# ---------------------------------------------------------------- running on ranks

def check_ring(fn, cases, *, exercise, reference, compare, hint, timeout=CHECK_TIMEOUT_S):
    """Run fn on every case; call compare(case, rank, value, args_after, torch's result) for
    every rank. `reference` is torch's collective, called in every rank as fn is."""
    __tracebackhide__ = True
    expect_callable(fn, exercise)
    expected = {}  # world_size -> torch's results, launched once the first case needs them
    for case in cases:
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(fn, case.rank_args, harness=sends_and_recvs_only,
                                exercise=exercise, where=case.where, hint=hint,
                                forbid=COLLECTIVES, why_forbidden=WHY_SEND_RECV,
                                hang_hint=HANG_HINT, guard=ANSWERS.in_rank, timeout=timeout,
                                received=received)
        if case.world_size not in expected:
            expected[case.world_size] = iter(_torch_results(reference, cases, case.world_size))
        want = next(expected[case.world_size])
        for rank, ((value, messages), args_after) in enumerate(outcomes):
            _expect_a_ring(case, rank, messages)
            compare(case, rank, value, args_after, want[rank])
        expect_received_data(received, [case.most_bytes()] * case.world_size, case.where,
                             "each step carries one chunk of about S/n bytes, not the whole "
                             "tensor", least=[case.least_bytes()] * case.world_size)
    ranks = sorted({case.world_size for case in cases}, reverse=True)
    print(f"{exercise}: passed on {len(cases)} cases ({', '.join(map(str, ranks))} ranks; "
          "uneven, empty and even chunks; float32 and float64; chunks of "
          f"{WIRE_FLOOR} bytes or more in one), equal to torch's, as a ring of sends and recvs, "
          "each rank receiving its chunks and no more (counted outside it)")


def _expect_a_ring(case, rank, messages):
    """Fail unless this rank's messages went one way round the ring, a chunk per step at most."""
    __tracebackhide__ = True
    n = case.world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    to = {peer for op, peer, _ in messages if op == "send"}
    source = {peer for op, peer, _ in messages if op == "recv"}
    if not (to <= {right} and source <= {left}) and not (to <= {left} and source <= {right}):
        fail(case.where, rank, f"sent to {_peers(to)} and received from {_peers(source)}, which "
                               "is not a ring", RING_HINT)
    sent, most = sum(nbytes for op, _, nbytes in messages if op == "send"), case.most_bytes()
    if sent > most:
        fail(case.where, rank, f"sent {sent} bytes, more than a ring sends: {case.steps} steps "
                               f"of one chunk, {most} bytes at most",
             "each step carries one chunk of about S/n bytes, not the whole tensor")


def _peers(peers):
    if None in peers:  # dist.recv(tensor) without src takes a message from any rank
        return "any rank (recv without src)"
    return f"rank {join(sorted(peers))}" if len(peers) == 1 else f"ranks {join(sorted(peers))}"


def _torch_results(reference, cases, world_size):
    """torch's results for the cases on world_size ranks, in one launch: [case][rank]."""
    picked = [case.rank_args for case in cases if case.world_size == world_size]
    per_rank = dlcourse.launch(_on_every_rank, reference, picked, world_size=world_size,
                               backend="gloo", timeout=CHECK_TIMEOUT_S)
    return [list(results) for results in zip(*per_rank)]


def _on_every_rank(reference, cases_args):
    rank = dist.get_rank()
    return [reference(*rank_args[rank]) for rank_args in cases_args]


# ---------------------------------------------------------------- comparing, and saying why

def expect_chunks(got, expected, case, *, rank, verb, chunk_of, explain, shape_hint):
    """Fail unless got equals expected exactly: '<where>: rank R <verb> wrong values in chunk C
    (<chunk_of's words>): element [i] is X, expected Y', then the hint explain(C) gives."""
    __tracebackhide__ = True
    if not (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and got.dtype == expected.dtype):
        same_shape = isinstance(got, torch.Tensor) and got.shape == expected.shape
        expect_tensor(got, expected, where=case.where, rank=rank,
                      hint=DTYPE_HINT if same_shape else shape_hint)
    wrong = got.detach().cpu() != expected
    if not wrong.any():
        return
    index = wrong.nonzero()[0].tolist()  # the first wrong element, as an index into got
    flat = int(wrong.reshape(-1).nonzero()[0])
    chunk, words = chunk_of(flat)
    problem = (f"{verb} wrong values in chunk {chunk} ({words}): element {index} is "
               f"{got.reshape(-1)[flat].item()!r}, expected {expected.reshape(-1)[flat].item()!r}"
               f" ({int(wrong.sum())} of {wrong.numel()} elements differ)")
    fail(case.where, rank, problem, explain(chunk))


def in_flat(bounds, what):
    """chunk_of for a result laid out like the whole tensor: element -> (chunk, its range)."""
    def chunk_of(flat):
        c = next(c for c, (start, stop) in enumerate(bounds) if start <= flat < stop)
        start, stop = bounds[c]
        return c, f"elements {start} to {stop - 1} of {what}"
    return chunk_of


def sum_of(values, inputs, bounds, first):
    """(c, k) such that values == sum over ranks q of k[q] x chunk c of inputs[q], each k[q] in
    0, 1, 2, trying chunk `first` first; or None. Whole-number inputs make the match exact."""
    values = values.reshape(-1).double()
    order = [first] + [c for c in range(len(bounds)) if c != first]
    for c in order:
        start, stop = bounds[c]
        if stop - start != values.numel() or stop == start:
            continue
        pieces = [x.reshape(-1)[start:stop].double() for x in inputs]
        for k in itertools.product(range(3), repeat=len(inputs)):  # 3^4 = 81 sums at most
            if torch.equal(sum(m * p for m, p in zip(k, pieces)), values):
                return c, k
    return None


def holds(c, k):
    """What a chunk holds, in words: k[q] copies of rank q's chunk c."""
    ranks = [q for q, m in enumerate(k) if m]
    missing = [q for q, m in enumerate(k) if not m]
    twice = [q for q, m in enumerate(k) if m == 2]
    if twice:
        return f"chunk {c} with the values of {_ranks(twice)} added twice"
    if not ranks:
        return "zeros"
    if not missing:
        return f"the complete sum of chunk {c}"
    if len(ranks) == 1:
        return f"only rank {ranks[0]}'s own values of chunk {c}"
    return f"chunk {c} summed over ranks {join(ranks)} only, without {_ranks(missing)}"


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {join(ranks)}"


def join(items):
    """'0, 1 and 3'."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
