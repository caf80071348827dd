"""Lesson 02's check of ring_all_reduce (`dlcourse/checks/collectives/ring_all_reduce.py`,
`rings.py`) on real gloo ranks: the solution passes, and the wrong rings students write fail
with the rank, the chunk, expected vs got and a hint."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.collectives

from checking import first_line_and_message
from dlcourse.checks.collectives import check_ring_all_reduce
from ring_answers import (_ring, _step, assert_not_a_ring, assert_refused, ring_all_gather,
                          ring_all_reduce, ring_reduce_scatter)


def ar_without_all_gather(tensor):  # only this rank's chunk of the sum is written back
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    flat.tensor_split(n)[rank].copy_(ring_reduce_scatter(flat))


def ar_rebinds_the_name(tensor):  # `tensor = ...` changes nothing for the caller
    flat = tensor.view(-1)
    tensor = ring_all_gather(ring_reduce_scatter(flat), flat.numel())
    return tensor


def ar_phases_disagree(tensor):  # in place; the all-gather starts from chunk r + 1
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    chunks = list(tensor.view(-1).tensor_split(n))
    for k in range(n - 1):  # reduce-scatter: chunk r ends complete on rank r
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(chunks[recv_c])
        _step(chunks[send_c], received, right, left)
        chunks[recv_c] += received
    for k in range(n - 1):  # all-gather as if chunk r + 1 were the complete one
        _step(chunks[(rank - k + 1) % n], chunks[(rank - k) % n], right, left)


def ar_assumes_even(tensor):  # in place, chunks of numel // n: the remainder stays as it was
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    flat = tensor.view(-1)
    size = flat.numel() // n
    chunks = [flat[c * size:(c + 1) * size] for c in range(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank - k - 1) % n, (rank - k - 2) % n
        received = torch.empty_like(chunks[recv_c])
        _step(chunks[send_c], received, right, left)
        chunks[recv_c] += received
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, left)


def ar_not_flattened(tensor):  # the exercise's functions on a matrix: rows, not elements
    tensor.copy_(ring_all_gather(ring_reduce_scatter(tensor), tensor.numel()))


def ar_passes_whole_tensors(tensor):  # round the ring, but every step carries all of it
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    total, piece = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(piece)
        _step(piece, incoming, right, left)
        total += incoming
        piece = incoming
    tensor.copy_(total)


def ar_averages(tensor):  # data parallel's mean, where all_reduce sums
    ring_all_reduce(tensor)
    tensor /= dist.get_world_size()


def ar_with_torch(tensor):
    dist.all_reduce(tensor)


def ar_with_the_library(tensor):
    dlcourse.collectives.ring_all_reduce(tensor)


def ar_with_the_library_tree(tensor):
    dlcourse.collectives.tree_all_reduce(tensor)


AR_EVEN = ("ring_all_reduce on 4 ranks, tensor: float32 tensor of shape (12,) in chunks of "
           "3, 3, 3, 3: ")


def test_all_reduce_solution_passes(capsys):
    check_ring_all_reduce(ring_all_reduce)
    assert "ring_all_reduce: passed on 9 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (ar_without_all_gather, AR_EVEN + "rank 0 left wrong values in chunk 1 (elements 3 to 5 of "
                                      "the flattened tensor): element [3] is",
     "on rank 0 chunk 1 holds only rank 0's own values of chunk 1: after the reduce-scatter "
     "only chunk r is complete on rank r; the all-gather phase brings"),
    (ar_rebinds_the_name, AR_EVEN + "rank 0 left tensor as it was (your function returned "
                                    "float32 tensor of shape (12,)): all-reduce works in place",
     "`tensor = ...` only rebinds a name"),
    (ar_phases_disagree, AR_EVEN + "rank 0 left wrong values in chunk 0",
     "the reduce-scatter must leave chunk r complete on rank r, and the all-gather starts by "
     "sending it on"),
    (ar_assumes_even, "ring_all_reduce on 4 ranks, tensor: float64 tensor of shape (10,) in "
                      "chunks of 3, 3, 2, 2: rank 0 left wrong values in chunk 3 (elements 8 to 9",
     "only the last 2 elements are wrong, the numel % n that chunks of numel // n = 2 leave out"),
    (ar_averages, AR_EVEN + "rank 0 left wrong values in chunk 0", "that is the mean over the "
                                                                    "ranks, not the sum"),
    (ar_not_flattened, "ring_all_reduce on 4 ranks, tensor: float64 tensor of shape (2, 5), "
                       "flattened, in chunks of 3, 3, 2, 2: rank ",  # then "N raised RuntimeError"
     "on the flattened tensor (tensor.view(-1))"),
])
def test_all_reduce_rejects_plausible_wrong_answers(wrong, says, hint):
    first, message = first_line_and_message(check_ring_all_reduce, wrong)
    assert first.startswith(says)
    assert any(w in first for w in ("expected", "as it was", "raised RuntimeError"))
    assert hint in message.split("\nHint: ", 1)[1]


@pytest.mark.parametrize("wrong, says", [
    (ar_with_torch, "called dist.all_reduce"),
    (ar_with_the_library, "used the course's own ring all_reduce"),
    (ar_with_the_library_tree, "used the course's own tree all_reduce"),
])
def test_torch_collectives_and_the_course_library_are_refused(wrong, says):
    assert_refused(check_ring_all_reduce, wrong, says)


def test_right_values_that_did_not_go_round_a_ring_fail():
    assert_not_a_ring(check_ring_all_reduce, ar_passes_whole_tensors,
                      AR_EVEN + "rank 0 sent 144 bytes, more than a ring sends: 6 steps of one "
                                "chunk, 72 bytes at most")
