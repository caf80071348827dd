"""Lesson 02's check of ring_reduce_scatter (`dlcourse/checks/collectives/ring_reduce_scatter.py`,
`rings.py`) on real gloo ranks: the solution passes, and the wrong rings students write fail
with the rank, the chunk, expected vs got and a hint."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.collectives

from checking import first_line_and_message
from dlcourse.checks.collectives import check_ring_reduce_scatter
from ring_answers import _ring, _step, assert_not_a_ring, assert_refused, ring_reduce_scatter

# A deadlock is only reported at the check's timeout: 3 s here (10 s in a notebook) keeps the
# suite short and still leaves a loaded machine time to start 4 ranks.
HANG_TIMEOUT_S = 3


def rs_off_by_one(x):  # sends chunk r - k: chunk r + 1 ends complete, chunk r never comes back
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k) % n, (rank - k - 1) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        partial[recv_c] += received
    return partial[rank]


def rs_assumes_even(x):  # chunks of numel // n: the remainder is never sent
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    size = x.numel() // n
    partial = [x[c * size:(c + 1) * size].clone() for c in range(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        partial[recv_c] += received
    return partial[rank]


def rs_with_chunk(x):  # torch.chunk, not tensor_split: 10 on 4 ranks is 3, 3, 3, 1
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.chunk(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        partial[recv_c] += received
    return partial[rank]


def rs_ring_backwards(x):  # sends to the left, receives from the right, same chunk indices
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, left, right)
        partial[recv_c] += received
    return partial[rank]


def rs_blocking_send_first(x):  # dist.send waits for the receiver, who is sending too
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        dist.send(partial[send_c], right)
        dist.recv(received, left)
        partial[recv_c] += received
    return partial[rank]


def rs_returns_last_received(x):  # the last partial that arrives, without its own copy
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        if k == n - 2:
            return received
        partial[recv_c] += received
    return partial[rank]


def rs_in_place_on_x(x):  # adds into views of x: right values, but the caller's x changes
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = list(x.tensor_split(n))
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        partial[recv_c] += received
    return partial[rank].clone()


def rs_through_rank_0(x):  # right values, but rank 0 sums everything: not a ring
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(x, 0)
        mine = torch.empty_like(x.tensor_split(n)[rank])
        dist.recv(mine, 0)
        return mine
    total = x.clone()
    for peer in range(1, n):
        received = torch.empty_like(x)
        dist.recv(received, peer)
        total += received
    for peer in range(1, n):
        dist.send(total.tensor_split(n)[peer].clone(), peer)
    return total.tensor_split(n)[0].clone()


def rs_with_torch(x):
    n = dist.get_world_size()
    chunks = list(x.tensor_split(n))
    out = torch.empty_like(chunks[dist.get_rank()])
    dist.reduce_scatter(out, chunks)
    return out


def rs_with_the_library(x):  # built from send/recv, so forbid= alone would let it through
    n = dist.get_world_size()
    chunks = list(x.tensor_split(n))
    out = torch.empty_like(chunks[dist.get_rank()])
    dlcourse.collectives.ring_reduce_scatter(out, chunks)
    return out


RS_EVEN = ("ring_reduce_scatter on 4 ranks, x: float32 tensor of shape (12,) in chunks of "
           "3, 3, 3, 3: ")
RS_UNEVEN = ("ring_reduce_scatter on 4 ranks, x: float64 tensor of shape (10,) in chunks of "
             "3, 3, 2, 2: ")
STEP_RULE = "at step k (0 to n - 2) rank r sends its partial sum of chunk (r - k - 1) % n"


def test_reduce_scatter_solution_passes(capsys):
    check_ring_reduce_scatter(ring_reduce_scatter)
    assert "ring_reduce_scatter: passed on 8 cases (4, 3, 2 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (rs_off_by_one, RS_EVEN + "rank 0 returned wrong values in chunk 0 (elements 0 to 2 of x): "
                              "element [0] is",
     "rank 0 holds only rank 0's own values of chunk 0: nothing it received was added"),
    (rs_assumes_even, RS_UNEVEN + "rank 0 returned shape (2,), expected (3,)",
     "10 elements on 4 ranks make chunks of 3, 3, 2, 2, so rank 0's has 3"),
    (rs_with_chunk, RS_UNEVEN + "rank 2 returned shape (3,), expected (2,)",
     "x.tensor_split(world_size)"),
    (rs_ring_backwards, RS_EVEN + "rank 0 returned wrong values in chunk 0", STEP_RULE),
    (rs_returns_last_received, RS_EVEN + "rank 0 returned wrong values in chunk 0",
     "rank 0 holds chunk 0 summed over ranks 1, 2 and 3 only, without rank 0: add its own copy"),
    (rs_in_place_on_x, RS_EVEN + "rank 0 changed x in place", "add into clones of x's chunks"),
])
def test_reduce_scatter_rejects_plausible_wrong_answers(wrong, says, hint):
    first, message = first_line_and_message(check_ring_reduce_scatter, wrong)
    assert first.startswith(says)
    assert "expected" in first or "in place" in first
    assert hint in message.split("\nHint: ", 1)[1]


def test_a_ring_where_every_rank_sends_first_fails_in_seconds_saying_it_hung():
    first, message = first_line_and_message(check_ring_reduce_scatter, rs_blocking_send_first,
                                             timeout=HANG_TIMEOUT_S)
    assert first.startswith(RS_EVEN + f"did not finish within {HANG_TIMEOUT_S} s on 4 ranks")
    assert "Hint: in a ring rank r sends only to (r + 1) % n" in message
    assert "start the send with dist.isend, then dist.recv" in message


@pytest.mark.parametrize("wrong, says", [
    (rs_with_torch, "called dist.reduce_scatter, which this exercise does not allow"),
    (rs_with_the_library, "used the course's own ring reduce_scatter from dlcourse.collectives, "
                          "which this exercise does not allow"),
])
def test_torch_collectives_and_the_course_library_are_refused(wrong, says):
    assert_refused(check_ring_reduce_scatter, wrong, says)


def test_right_values_that_did_not_go_round_a_ring_fail():
    assert_not_a_ring(check_ring_reduce_scatter, rs_through_rank_0,
                      RS_EVEN + "rank 0 sent to ranks 1, 2 and 3 and received from ranks 1, 2 "
                                "and 3, which is not a ring")
