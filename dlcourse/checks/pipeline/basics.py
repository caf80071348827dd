"""Lesson 06's boundaries, bubble and exchange checks (the set's guide is `__init__.py`)."""

import numbers

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, call_each_in_process, describe,
                                  expect_callable, fail, fresh_cases, kind, run_on_ranks)
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, wire_floor_units
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.in_rank import exchange_in_rank
from dlcourse.checks.pipeline.stages import join, stage_counts



def _each(fn, calls, exercise):
    """[(args, where)] -> each case's answer, in order (graded: every case in one launch)."""
    __tracebackhide__ = True
    return call_each_in_process(fn, calls, exercise=exercise, guard=ANSWERS.in_process)


# ---------------------------------------------------------------- exercise 1: stage boundaries

BOUNDARY_HINT = ("stage s holds n_layers // n_stages blocks, and n_layers % n_stages stages "
                 "one more; the boundaries are the running sums of those sizes, from 0 to "
                 "n_layers")
LAST_STAGE_HINT = ("the last stage also runs the output layer and the loss (lesson 06 measures "
                   "it slower): give the n_layers % n_stages extra blocks to other stages, the "
                   "first ones or, as Llama 3 does, the middle ones")


@fresh_cases
def check_stage_boundaries(stage_boundaries, *, rng):
    """stage_boundaries(n_layers, n_stages) -> [b_0 = 0, b_1, ..., b_p = n_layers]: stage s holds
    blocks b_s to b_{s+1} - 1, sizes differing by at most one (the blocks cost alike), and the
    last stage, which also runs the output layer and the loss, not among the larger ones. Where
    the extra blocks go otherwise is the student's choice: first stages, middle ones."""
    __tracebackhide__ = True
    expect_callable(stage_boundaries, "stage_boundaries")
    cases = [(p * rng.randint(1, 4) + (rng.randint(1, p - 1) if i % 2 else 0), p)
             for i, p in enumerate(stage_counts(rng, 6))]
    calls = [((n, p), f"stage_boundaries(n_layers={n}, n_stages={p})") for n, p in cases]
    for (n, p), (_, where), got in zip(cases, calls,
                                       _each(stage_boundaries, calls, "stage_boundaries")):
        _expect_boundaries(got, n, p, where)
    print(f"stage_boundaries: passed on {len(cases)} cases drawn at random ({_ps(cases)} "
          "stages; even and uneven splits): balanced, the last stage never one of the larger")


def _expect_boundaries(got, n, p, where):
    __tracebackhide__ = True
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]  # torch's split: extras first
    if not isinstance(got, (list, tuple)) or not all(
            isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in got):
        fail(where, None, f"returned {kind(got)}, expected a list of {p + 1} whole numbers",
             BOUNDARY_HINT)
    if len(got) != p + 1:
        fail(where, None, f"returned {len(got)} boundaries, expected n_stages + 1 = {p + 1}: "
                          "stage s holds the blocks from b[s] up to b[s + 1] - 1", BOUNDARY_HINT)
    if got[0] != 0 or got[-1] != n:
        fail(where, None, f"returned {list(got)}, which must start at 0 and end at "
                          f"n_layers = {n}, so that every block is on one stage", BOUNDARY_HINT)
    held = [b - a for a, b in zip(got, got[1:])]
    if min(held) < 1:
        s = held.index(min(held))
        fail(where, None, f"returned {list(got)}: stage {s} holds {held[s]} blocks",
             "boundaries only grow, and every stage holds at least one block")
    if max(held) - min(held) > 1:
        fail(where, None, f"returned {list(got)}: stages hold {join(held)} blocks, not "
                          f"balanced (a stage waits for the slowest, {max(held)} blocks)",
             f"{n} blocks on {p} stages: n_layers // n_stages = {n // p} each, one more on "
             f"n_layers % n_stages = {n % p} of them, e.g. the first: sizes {join(sizes)}")
    if held[-1] > min(held):
        fail(where, None, f"returned {list(got)}: stages hold {join(held)} blocks; balanced, "
                          f"but the last stage holds one of the extra blocks and also runs "
                          f"the output layer and the loss: it is the slowest stage",
             LAST_STAGE_HINT)


# ---------------------------------------------------------------- exercise 5: the bubble

BUBBLE_HINT = ("the last stage starts p - 1 forward times late and stage 0 finishes p - 1 "
               "backward times after it: idle / (idle + busy) = (p - 1) / (m + p - 1)")
T_FORWARD, T_BACKWARD = 1.0, 2.0  # a backward costs about two forwards; the share does not care


@fresh_cases
def check_bubble_fraction(bubble_fraction, *, rng):
    """bubble_fraction(n_stages, n_micro) -> the share of a GPipe (or 1F1B) step a stage sits
    idle, against a timeline simulated here with forwards of 1 and backwards of 2."""
    __tracebackhide__ = True
    expect_callable(bubble_fraction, "bubble_fraction")
    cases = [(p, rng.randint(1, 4 * p)) for p in stage_counts(rng, 5) + [rng.randint(6, 8)]]
    calls = [((p, m), f"bubble_fraction(n_stages={p}, n_micro={m})") for p, m in cases]
    for (p, m), (_, where), got in zip(cases, calls,
                                       _each(bubble_fraction, calls, "bubble_fraction")):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number between 0 and 1",
                 BUBBLE_HINT)
        got, expected = float(got), _simulated_bubble(p, m)  # float: a Fraction is fine
        # a ratio of small whole numbers: float rounding only, ~1e-16
        if abs(got - expected) > 1e-12:
            fail(where, None, f"returned {got:.6g}, the simulated timeline is idle "
                              f"{expected:.6g} of the time", _bubble_hint(got, p, m))
    print(f"bubble_fraction: passed on {len(cases)} cases drawn at random "
          f"({_ps([(0, p) for p, _ in cases])} stages; 1 to {max(m for _, m in cases)} "
          "micro-batches), equal to a simulated timeline's idle share")


def _simulated_bubble(p, m):
    """GPipe on a timeline: a forward starts when its input has arrived and its stage is free;
    the backwards start after the stage's last forward, each after the next stage's."""
    end_f = [[0.0] * m for _ in range(p)]
    for r in range(p):
        for i in range(m):
            start = max(end_f[r - 1][i] if r else 0.0, end_f[r][i - 1] if i else 0.0)
            end_f[r][i] = start + T_FORWARD
    end_b = [[0.0] * m for _ in range(p)]
    for r in reversed(range(p)):
        for i in range(m):
            start = max(end_b[r + 1][i] if r < p - 1 else 0.0,
                        end_b[r][i - 1] if i else end_f[r][m - 1])
            end_b[r][i] = start + T_BACKWARD
    total = max(max(row) for row in end_b)
    return 1 - m * (T_FORWARD + T_BACKWARD) / total


def _bubble_hint(got, p, m):
    if abs(got - (p - 1) / m) < 1e-9:
        return ("(p - 1) / m is the idle time over the busy time; the share of the whole step "
                "is idle / (idle + busy)")
    if abs(got - (1 - _simulated_bubble(p, m))) < 1e-9:
        return "that is the busy share; the bubble is the rest"
    return BUBBLE_HINT


# ---------------------------------------------------------------- exercise 2: the exchange

WHY_P2P = ("neighbouring stages talk with point-to-point ops only: dist.send/recv, "
           "isend/irecv or batch_isend_irecv")
EXCHANGE_HANG = ("dist.send waits until the peer calls recv, so if both neighbours send first "
                 "both wait forever (gloo: at any size). Post the receive first with dist.irecv, "
                 "or send with dist.isend, or let the lower rank send first while the higher "
                 "receives first, or use dist.batch_isend_irecv")
EXCHANGE_HINT = ("receive into a new buffer, torch.empty_like(tensor), from `peer`; send "
                 "`tensor` to `peer`; return the buffer")


@fresh_cases
def check_exchange(exchange, timeout=CHECK_TIMEOUT_S, *, rng):
    """exchange(tensor, peer, group) -> the tensor `peer` sent, while `peer` receives `tensor`:
    each rank exchanges with its left and right neighbour on p real ranks."""
    __tracebackhide__ = True
    expect_callable(exchange, "exchange")
    ps = [2] + rng.sample([3, 4, 5], 2)
    wide = rng.randrange(len(ps))  # the case whose tensors stand clear of gloo's headers
    for i, p in enumerate(ps):
        _check_exchange_case(exchange, p, rng, timeout, wide=i == wide)
    print(f"exchange: passed on {len(ps)} cases drawn at random ({join(ps)} ranks, each with "
          "its left and right neighbour; float32 and float64; tensors of "
          f"{WIRE_FLOOR} bytes or more in one), no deadlock, every rank got its neighbour's "
          "tensor, and received its neighbours' bytes, no fewer and no more (counted outside it)")


def _check_exchange_case(exchange, p, rng, timeout, wide=False):
    __tracebackhide__ = True
    shape = (rng.randint(1, 5), rng.randint(1, 40))
    dtype = rng.choice([torch.float32, torch.float64])
    if wide:  # each tensor WIRE_FLOOR bytes or more
        shape = (shape[0], max(shape[1], wire_floor_units(shape[0] * dtype.itemsize)))
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    # sent[(r, q)]: what rank r sends to q. Even ranks talk right first, odd ranks left first.
    sent = {(r, q): torch.randn(shape, generator=gen, dtype=dtype)
            for r in range(p) for q in (r - 1, r + 1) if 0 <= q < p}
    calls = [[(q, sent[(r, q)]) for q in sorted((r - 1, r + 1), reverse=r % 2 == 1)
              if 0 <= q < p] for r in range(p)]
    where = f"exchange on {p} ranks, {describe(sent[(0, 1)])}"
    received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
    outcomes = run_on_ranks(exchange, [(c,) for c in calls], exercise="exchange", where=where,
                            hint=EXCHANGE_HINT, forbid=COLLECTIVES, why_forbidden=WHY_P2P,
                            hang_hint=EXCHANGE_HANG, harness=exchange_in_rank,
                            guard=ANSWERS.in_rank, timeout=timeout, received=received)
    for r, (results, _) in enumerate(outcomes):
        for (q, own), (got, after, moved) in zip(calls[r], results):
            if not torch.equal(after, own):
                fail(where, r, f"changed the tensor it sent to rank {q} in place: the caller "
                               "still needs it (it is the stage's activation)", EXCHANGE_HINT)
            _expect_received(got, sent, r, q, where)
            _expect_moved(moved, own, r, q, where)
    # rank r receives one tensor from each neighbour, its counter faked or not
    size = sent[(0, 1)].numel() * sent[(0, 1)].element_size()
    data = [size * len(c) for c in calls]
    expect_received_data(received, data, where, EXCHANGE_HINT, least=data,
                         peers=[len(c) for c in calls])


def _expect_moved(moved, tensor, r, q, where):
    """The exchange sent and received at least the tensor's bytes through send/recv."""
    __tracebackhide__ = True
    size = tensor.numel() * tensor.element_size()
    for op, verb in (("send", "sent"), ("recv", "received")):
        if moved[op] < size:
            fail(where, r, f"{verb} {moved[op]} bytes through {op} in the exchange with rank {q}, "
                           f"less than the {size}-byte tensor: data between stages goes through "
                           "send and recv (moved another way, it does not count)", EXCHANGE_HINT)


def _expect_received(got, sent, r, q, where):
    __tracebackhide__ = True
    expected = sent[(q, r)]
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape \
            or got.dtype != expected.dtype:
        fail(where, r, f"returned {kind(got)} from the exchange with rank {q}, expected "
                       f"{describe(expected)}", EXCHANGE_HINT)
    if torch.equal(got, expected):
        return
    problem = f"got wrong values from the exchange with rank {q}"
    if torch.equal(got, sent[(r, q)]):
        fail(where, r, f"{problem}: it returned the tensor it sent, not the one it received",
             EXCHANGE_HINT)
    whose = next((f"rank {a}'s tensor for rank {b}" for (a, b), t in sent.items()
                  if torch.equal(got, t)), None)
    fail(where, r, problem + (f": it holds {whose}" if whose else ""),
         "a recv without src takes the first message from any rank: name the peer"
         if whose else EXCHANGE_HINT)


def _ps(cases):
    return join(sorted({p for _, p in cases}))
