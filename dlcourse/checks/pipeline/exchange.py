"""Lesson 06, exercise 2 (`exercises/06_pipeline.ipynb`): `check_exchange`, send a tensor to a
neighbouring stage and receive its tensor, on real ranks, point-to-point ops only; a deadlock
is named with what makes two sends wait forever.
"""

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, describe, expect_callable, fail,
                                  fresh_cases, kind, run_on_ranks)
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, wire_floor_units
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.in_rank import exchange_in_rank
from dlcourse.checks.pipeline.stages import join


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
