"""Lesson 02's check of ring_all_gather (`dlcourse/checks/collectives/ring_all_gather.py`,
`rings.py`) on real gloo ranks: the solution passes, and the wrong rings students write fail
with the rank, the chunk, expected vs got and a hint."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.collectives

from checking import first_line_and_message
from dlcourse.checks.collectives import check_ring_all_gather
from ring_answers import _ring, _step, assert_refused, ring_all_gather

# A deadlock is only reported at the check's timeout: 3 s here (10 s in a notebook) keeps the
# suite short and still leaves a loaded machine time to start 4 ranks.
HANG_TIMEOUT_S = 3


def ag_reduce_scatter_indices(chunk, numel):  # copied from the reduce-scatter: r - k - 1 first
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k - 1) % n], chunks[(rank - k - 2) % n], right, left)
    return out


def ag_own_chunk_not_in_place(chunk, numel):  # sends its chunk, never copies it into out
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.zeros(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)
    for k in range(n - 1):
        _step(chunk if k == 0 else chunks[(rank - k) % n], chunks[(rank - k - 1) % n],
              right, left)
    return out


def ag_assumes_even(chunk, numel):  # every chunk as long as its own: n x len(chunk) elements
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(n * chunk.numel(), dtype=chunk.dtype)
    chunks = out.chunk(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, left)
    return out


def ag_float32_buffer(chunk, numel):  # torch.empty(numel) is float32 whatever chunk is
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, left)
    return out


def ag_receives_from_the_right(chunk, numel):  # sends right and receives from the right too
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, right)
    return out


def ag_with_torch(chunk, numel):
    out = [torch.empty_like(chunk) for _ in range(dist.get_world_size())]
    dist.all_gather(out, chunk)
    return torch.cat(out)


def ag_with_the_library(chunk, numel):
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = list(out.tensor_split(dist.get_world_size()))
    dlcourse.collectives.ring_all_gather(chunks, chunk)
    return out


AG_EVEN = "ring_all_gather(chunk, numel=12) on 4 ranks, float32 chunks of 3, 3, 3, 3: "
AG_UNEVEN = "ring_all_gather(chunk, numel=10) on 4 ranks, float64 chunks of 3, 3, 2, 2: "


def test_all_gather_solution_passes(capsys):
    check_ring_all_gather(ring_all_gather)
    assert "ring_all_gather: passed on 8 cases" in capsys.readouterr().out


def all_gather_with_exchange(chunk, numel):  # the lesson's one-step helper is send/recv too
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        dlcourse.collectives.exchange(chunks[(rank - k) % n], chunks[(rank - k - 1) % n],
                                      right, left)
    return out


def all_gather_the_other_way_round(chunk, numel):  # a ring too: send left, receive from right
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank + k) % n], chunks[(rank + k + 1) % n], left, right)
    return out


@pytest.mark.parametrize("solution", [all_gather_with_exchange, all_gather_the_other_way_round])
def test_other_rings_pass_too(solution, capsys):
    # The lesson's one-step helper is send/recv too; a ring may run in either direction.
    check_ring_all_gather(solution)
    assert "ring_all_gather: passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (ag_reduce_scatter_indices, AG_EVEN + "rank 0 returned wrong values in chunk 0 (elements 0 "
                                          "to 2 of the result): element [0] is",
     "on rank 0 chunks 0, 1, 2 and 3 hold no rank's chunk"),
    (ag_own_chunk_not_in_place, AG_EVEN + "rank 0 returned wrong values in chunk 0 (elements 0 "
                                          "to 2 of the result): element [0] is 0.0, expected",
     "only rank 0's own chunk is wrong: no message brings it back"),
    (ag_float32_buffer, AG_UNEVEN + "rank 0 returned dtype float32, expected float64",
     "make every buffer with the input's dtype"),
])
def test_all_gather_rejects_plausible_wrong_answers(wrong, says, hint):
    first, message = first_line_and_message(check_ring_all_gather, wrong)
    assert first.startswith(says)
    assert hint in message.split("\nHint: ", 1)[1]


def test_all_gather_assuming_even_chunks_fails_on_uneven_ones():
    # Ranks disagree about message sizes; gloo aborts the rank that receives too much, or the
    # ring waits for bytes that never come: either way the case with uneven chunks fails.
    first, _ = first_line_and_message(check_ring_all_gather, ag_assumes_even,
                                       timeout=HANG_TIMEOUT_S)
    assert first.startswith(AG_UNEVEN)
    assert ("was killed by SIGABRT: " in first and "Received data size doesn't match" in first
            or "did not finish" in first), first


def test_all_gather_from_the_wrong_neighbour_hangs_and_says_so():
    first, message = first_line_and_message(check_ring_all_gather, ag_receives_from_the_right,
                                             timeout=HANG_TIMEOUT_S)
    assert first.startswith(AG_EVEN + f"did not finish within {HANG_TIMEOUT_S} s")
    assert "Hint: in a ring rank r sends only to (r + 1) % n and receives only from" in message


@pytest.mark.parametrize("wrong, says", [
    (ag_with_torch, "called dist.all_gather"),
    (ag_with_the_library, "used the course's own ring all_gather"),
])
def test_torch_collectives_and_the_course_library_are_refused(wrong, says):
    assert_refused(check_ring_all_gather, wrong, says)
