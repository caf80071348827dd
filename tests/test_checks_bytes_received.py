"""Issue 36: efficiency faked. An answer that sends more than its exercise needs (whole tensors
where a chunk belongs, an all-gather where a reduce-scatter belongs) and clears the records of
the check's CommCounter, so that the bytes its process says it sent are none, fails on the bytes
each rank received, counted by the kernel on its connections, outside it
(`core.ranks.expect_received_data`), in the self-check and graded alike. Each check has one
case of `WIRE_FLOOR` bytes or more a peer, so that the excess stands clear of gloo's headers;
the course's answers, and answers written another way, pass graded."""

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.collectives import (check_ring_all_gather, check_ring_all_reduce,
                                         check_ring_reduce_scatter)
from dlcourse.checks.core import Submitted
from ring_answers import ring_all_gather, ring_all_reduce, ring_reduce_scatter


def _clear_the_counters():
    """The 3 lines a student needs: every dispatch mode's records (the check's CommCounter)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        getattr(mode, "records", []).clear()


def _graded(name, fn):
    return Submitted(name, pickling.dumps(fn))


def assert_fails_on_what_it_received(check, name, cheat):
    for fn in (cheat, _graded(name, cheat)):  # the self-check, then graded
        first, _ = first_line_and_hint(check, fn)
        assert " received " in first and "at most" in first and "outside its process" in first, \
            first


# ---------------------------------------------------------------- lesson 02: the rings

def _whole_round_the_ring(x):
    """Every rank's whole x, passed round the ring (n - 1 steps of a whole tensor, not a chunk),
    in rank order."""
    rank, n = dist.get_rank(), dist.get_world_size()
    held = [None] * n
    held[rank] = x.reshape(-1).clone()
    for k in range(n - 1):
        came = torch.empty_like(held[rank])
        request = dist.isend(held[(rank - k) % n], (rank + 1) % n)
        dist.recv(came, (rank - 1) % n)
        request.wait()
        held[(rank - k - 1) % n] = came
    return held


def reduce_scatter_whole(x):
    total = sum(_whole_round_the_ring(x))
    _clear_the_counters()
    return total.tensor_split(dist.get_world_size())[dist.get_rank()].clone()


def all_gather_whole(chunk, numel):
    """Each rank's chunk placed in a zero tensor of numel, which goes round whole."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.zeros(numel, dtype=chunk.dtype)
    mine.tensor_split(n)[rank].copy_(chunk)
    total = sum(_whole_round_the_ring(mine))
    _clear_the_counters()
    return total


def all_reduce_whole(tensor):
    total = sum(_whole_round_the_ring(tensor))
    _clear_the_counters()
    tensor.copy_(total.view_as(tensor))


def ring_reduce_scatter_leftwards(x):
    """The ring the other way round, by batch_isend_irecv: another way, as cheap."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank - 1) % n, (rank + 1) % n  # sends to rank - 1, receives from rank + 1
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank + k + 1) % n, (rank + k + 2) % n
        received = torch.empty_like(partial[recv_c])
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, partial[send_c], right),
                                               dist.P2POp(dist.irecv, received, left)]):
            request.wait()
        partial[recv_c] += received
    return partial[rank]


@pytest.mark.parametrize("check, name, cheat", [
    (check_ring_reduce_scatter, "ring_reduce_scatter", reduce_scatter_whole),
    (check_ring_all_gather, "ring_all_gather", all_gather_whole),
    (check_ring_all_reduce, "ring_all_reduce", all_reduce_whole)],
    ids=["reduce_scatter", "all_gather", "all_reduce"])
def test_a_ring_of_whole_tensors_with_its_records_cleared_fails(check, name, cheat):
    assert_fails_on_what_it_received(check, name, cheat)


@pytest.mark.parametrize("check, name, answer", [
    (check_ring_reduce_scatter, "ring_reduce_scatter", ring_reduce_scatter),
    (check_ring_reduce_scatter, "ring_reduce_scatter", ring_reduce_scatter_leftwards),
    (check_ring_all_gather, "ring_all_gather", ring_all_gather),
    (check_ring_all_reduce, "ring_all_reduce", ring_all_reduce)],
    ids=["reduce_scatter", "reduce_scatter_leftwards", "all_gather", "all_reduce"])
def test_a_ring_passes_graded(check, name, answer):
    check(_graded(name, answer))
