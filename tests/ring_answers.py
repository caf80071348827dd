"""The right answers to lesson 02's ring exercises, shared by the tests of its checks: later
rings are built from earlier ones, as a student builds them (sent to the ranks by value)."""

import sys

import cloudpickle

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_message

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _ring(rank, n):
    """(right, left): where rank r sends, and where it receives from."""
    return (rank + 1) % n, (rank - 1) % n


def _step(send, recv, right, left):
    """One ring step: send to the right while receiving from the left."""
    request = dist.isend(send, right)
    dist.recv(recv, left)
    request.wait()


def ring_reduce_scatter(x):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(partial[recv_c])
        _step(partial[send_c], received, right, left)
        partial[recv_c] += received
    return partial[rank]


def ring_all_gather(chunk, numel):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)  # views into out: each message lands in its place
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, left)
    return out


def ring_all_reduce(tensor):
    flat = tensor.view(-1)
    total = ring_all_gather(ring_reduce_scatter(flat), flat.numel())
    flat.copy_(total)


def assert_refused(check, wrong, says):
    """A check refuses `wrong` (torch's collective, or the course's own ring), saying so."""
    first, _ = first_line_and_message(check, wrong)
    assert says in first
    assert first.endswith("build it from dist.isend, dist.irecv, dist.send and dist.recv (or "
                          "dist.batch_isend_irecv)")


def assert_not_a_ring(check, wrong, says):
    """Right values that did not go round a ring fail, with a hint."""
    with pytest.raises(Exception) as failed:
        check(wrong)
    first, _, rest = str(failed.value).partition("\n")
    assert first == says
    assert "Hint: " in rest

