"""Lesson 02's checks (`dlcourse/checks/collectives.py`) on real gloo ranks: the solutions pass,
and the wrong rings students write fail with the rank, the chunk, expected vs got and a hint; a
ring that deadlocks fails in seconds saying it hung; torch's collectives and the course's own
library ring are refused. Then the cost model's wrong formulas, each with the term it got wrong."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.collectives
from dlcourse.collectives import predict_time
from dlcourse.checks.collectives import (
    check_all_reduce_time, check_ring_all_gather, check_ring_all_reduce,
    check_ring_reduce_scatter,
)
from dlcourse.checks.core import CheckFailed, run_on_ranks

# A deadlock is only reported at the check's timeout: 3 s here (10 s in a notebook) keeps the
# suite short and still leaves a loaded machine time to start 4 ranks.
HANG_TIMEOUT_S = 3


def _ring(rank, n):
    """(right, left): where rank r sends, and where it receives from."""
    return (rank + 1) % n, (rank - 1) % n


def _step(send, recv, right, left):
    """One ring step: send to the right while receiving from the left."""
    request = dist.isend(send, right)
    dist.recv(recv, left)
    request.wait()


# --- ring_reduce_scatter: the solution and the wrong answers students write -----------------

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


# --- ring_all_gather ------------------------------------------------------------------------

def ring_all_gather(chunk, numel):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = _ring(rank, n)
    out = torch.empty(numel, dtype=chunk.dtype)
    chunks = out.tensor_split(n)  # views into out: each message lands in its place
    chunks[rank].copy_(chunk)
    for k in range(n - 1):
        _step(chunks[(rank - k) % n], chunks[(rank - k - 1) % n], right, left)
    return out


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


# --- ring_all_reduce ------------------------------------------------------------------------

def ring_all_reduce(tensor):
    flat = tensor.view(-1)
    total = ring_all_gather(ring_reduce_scatter(flat), flat.numel())
    flat.copy_(total)


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


# --- all_reduce_time ------------------------------------------------------------------------

def all_reduce_time(nbytes, world_size, alpha, beta):
    n = world_size
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta


def time_n_steps(nbytes, world_size, alpha, beta):  # n steps per phase, not n - 1
    n = world_size
    return 2 * n * alpha + 2 * (n - 1) / n * nbytes * beta


def time_one_phase(nbytes, world_size, alpha, beta):  # forgot the factor 2: no all-gather
    n = world_size
    return (n - 1) * alpha + (n - 1) / n * nbytes * beta


def time_whole_tensor_twice(nbytes, world_size, alpha, beta):  # 2 S, not 2(n - 1)/n S
    return 2 * (world_size - 1) * alpha + 2 * nbytes * beta


def time_one_alpha(nbytes, world_size, alpha, beta):  # latency paid once, as for one message
    n = world_size
    return alpha + 2 * (n - 1) / n * nbytes * beta


def time_naive(nbytes, world_size, alpha, beta):  # the root's link of the naive all-reduce
    n = world_size
    return 2 * (n - 1) * alpha + 2 * (n - 1) * nbytes * beta


def time_in_milliseconds(nbytes, world_size, alpha, beta):
    return 1000 * all_reduce_time(nbytes, world_size, alpha, beta)


def time_with_the_library(nbytes, world_size, alpha, beta):
    return predict_time("ring all_reduce", nbytes, world_size, alpha, beta)


def time_with_the_table(nbytes, world_size, alpha, beta):
    ring = dlcourse.collectives.ALGORITHMS["ring all_reduce"]
    return ring.steps(world_size) * alpha + ring.bytes_moved(nbytes, world_size) * beta


# --- the tests ------------------------------------------------------------------------------

def _first_line_and_hint(check, wrong, **kwargs):
    with pytest.raises(CheckFailed) as failed:
        check(wrong, **kwargs)
    message = str(failed.value)
    return message.splitlines()[0], message


RS_EVEN = ("ring_reduce_scatter on 4 ranks, x: float32 tensor of shape (12,) in chunks of "
           "3, 3, 3, 3: ")
RS_UNEVEN = ("ring_reduce_scatter on 4 ranks, x: float64 tensor of shape (10,) in chunks of "
             "3, 3, 2, 2: ")
STEP_RULE = "at step k (0 to n - 2) rank r sends its partial sum of chunk (r - k - 1) % n"


def test_reduce_scatter_solution_passes(capsys):
    check_ring_reduce_scatter(ring_reduce_scatter)
    assert "ring_reduce_scatter: passed on 6 cases (4, 3, 2 ranks" in capsys.readouterr().out


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
    first, message = _first_line_and_hint(check_ring_reduce_scatter, wrong)
    assert first.startswith(says)
    assert "expected" in first or "in place" in first
    assert hint in message.split("\nHint: ", 1)[1]


def test_a_ring_where_every_rank_sends_first_fails_in_seconds_saying_it_hung():
    first, message = _first_line_and_hint(check_ring_reduce_scatter, rs_blocking_send_first,
                                          timeout=HANG_TIMEOUT_S)
    assert first.startswith(RS_EVEN + f"did not finish within {HANG_TIMEOUT_S} s on 4 ranks")
    assert "Hint: in a ring rank r sends only to (r + 1) % n" in message
    assert "start the send with dist.isend, then dist.recv" in message


@pytest.mark.parametrize("check, wrong, says", [
    (check_ring_reduce_scatter, rs_with_torch, "called dist.reduce_scatter, which this exercise "
                                               "does not allow"),
    (check_ring_reduce_scatter, rs_with_the_library, "used the course's own ring reduce_scatter "
                                                     "from dlcourse.collectives, which this "
                                                     "exercise does not allow"),
    (check_ring_all_gather, ag_with_torch, "called dist.all_gather"),
    (check_ring_all_gather, ag_with_the_library, "used the course's own ring all_gather"),
    (check_ring_all_reduce, ar_with_torch, "called dist.all_reduce"),
    (check_ring_all_reduce, ar_with_the_library, "used the course's own ring all_reduce"),
    (check_ring_all_reduce, ar_with_the_library_tree, "used the course's own tree all_reduce"),
])
def test_torch_collectives_and_the_course_library_are_refused(check, wrong, says):
    first, _ = _first_line_and_hint(check, wrong)
    assert says in first
    assert first.endswith("build it from dist.isend, dist.irecv, dist.send and dist.recv (or "
                          "dist.batch_isend_irecv)")


AR_EVEN = ("ring_all_reduce on 4 ranks, tensor: float32 tensor of shape (12,) in chunks of "
           "3, 3, 3, 3: ")
AG_EVEN = "ring_all_gather(chunk, numel=12) on 4 ranks, float32 chunks of 3, 3, 3, 3: "
AG_UNEVEN = "ring_all_gather(chunk, numel=10) on 4 ranks, float64 chunks of 3, 3, 2, 2: "


def test_all_gather_solution_passes(capsys):
    check_ring_all_gather(ring_all_gather)
    assert "ring_all_gather: passed on 6 cases" in capsys.readouterr().out


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


@pytest.mark.parametrize("check, wrong, says", [
    (check_ring_reduce_scatter, rs_through_rank_0,
     RS_EVEN + "rank 0 sent to ranks 1, 2 and 3 and received from ranks 1, 2 and 3, which is "
               "not a ring"),
    (check_ring_all_reduce, ar_passes_whole_tensors,
     AR_EVEN + "rank 0 sent 144 bytes, more than a ring sends: 6 steps of one chunk, 72 bytes "
               "at most"),
])
def test_right_values_that_did_not_go_round_a_ring_fail(check, wrong, says):
    first, message = _first_line_and_hint(check, wrong)
    assert first == says
    assert "\nHint: " in message


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
    first, message = _first_line_and_hint(check_ring_all_gather, wrong)
    assert first.startswith(says)
    assert hint in message.split("\nHint: ", 1)[1]


def test_all_gather_assuming_even_chunks_fails_on_uneven_ones():
    # Ranks disagree about message sizes; gloo aborts the rank that receives too much, or the
    # ring waits for bytes that never come: either way the case with uneven chunks fails.
    first, _ = _first_line_and_hint(check_ring_all_gather, ag_assumes_even,
                                    timeout=HANG_TIMEOUT_S)
    assert first.startswith(AG_UNEVEN)
    assert "was killed by SIGABRT" in first or "did not finish" in first


def test_all_gather_from_the_wrong_neighbour_hangs_and_says_so():
    first, message = _first_line_and_hint(check_ring_all_gather, ag_receives_from_the_right,
                                          timeout=HANG_TIMEOUT_S)
    assert first.startswith(AG_EVEN + f"did not finish within {HANG_TIMEOUT_S} s")
    assert "Hint: in a ring rank r sends only to (r + 1) % n and receives only from" in message




def test_all_reduce_solution_passes(capsys):
    check_ring_all_reduce(ring_all_reduce)
    assert "ring_all_reduce: passed on 7 cases" in capsys.readouterr().out


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
    first, message = _first_line_and_hint(check_ring_all_reduce, wrong)
    assert first.startswith(says)
    assert any(w in first for w in ("expected", "as it was", "raised RuntimeError"))
    assert hint in message.split("\nHint: ", 1)[1]


# --- all_reduce_time ------------------------------------------------------------------------

FIRST_TIME = "all_reduce_time(nbytes=4,194,304, world_size=4, alpha=0.0001, beta=5e-10): "


def test_all_reduce_time_solution_passes(capsys):
    check_all_reduce_time(all_reduce_time)
    assert "all_reduce_time: passed on 4 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, got, hint", [
    (time_n_steps, "0.00394573", "Your alpha term counts 8 message steps, a ring all-reduce "
                                 "makes 2(n - 1) = 6: each phase takes n - 1 steps, not n"),
    (time_one_phase, "0.00187286", "0.75 x S bytes through a rank's link, a ring all-reduce "
                                   "2(n - 1)/n x S = 1.5 x S: one phase"),
    (time_whole_tensor_twice, "0.0047943", "Your beta term moves 2 x S bytes"),
    (time_one_alpha, "0.00324573", "Your alpha term counts 1 message step, a ring all-reduce "
                                   "makes 2(n - 1) = 6: every step is a message"),
    (time_naive, "0.0131829", "6 x S bytes through a rank's link"),
    (time_in_milliseconds, "3.74573", "that is the right time in milliseconds: return seconds"),
])
def test_all_reduce_time_rejects_wrong_formulas_naming_the_wrong_term(wrong, got, hint):
    first, message = _first_line_and_hint(check_all_reduce_time, wrong)
    assert first == (FIRST_TIME + f"returned {got} s, the alpha-beta model of a ring all-reduce "
                                  "gives 0.00374573 s")
    assert hint in message.split("\nHint: ", 1)[1]


@pytest.mark.parametrize("wrong, says", [
    (time_with_the_library, "called dlcourse.collectives.predict_time, which this exercise "
                            "does not allow"),
    (time_with_the_table, "used dlcourse.collectives.ALGORITHMS, which this exercise does not "
                          "allow"),
])
def test_the_lessons_cost_model_is_refused_and_put_back(wrong, says):
    first, _ = _first_line_and_hint(check_all_reduce_time, wrong)
    assert first.startswith(FIRST_TIME + says)
    assert globals()["predict_time"] is dlcourse.collectives.cost.predict_time
    assert dlcourse.collectives.predict_time is dlcourse.collectives.cost.predict_time
    assert wrong(1000, 4, 1.0, 0.0) == 6.0  # the table's rows are back: 2(n - 1) steps


# --- what every check does with an unwritten or misused function, and the core's hang hint --

def not_written(*args):
    raise NotImplementedError("Hint: n - 1 steps")


@pytest.mark.parametrize("check, name", [
    (check_ring_reduce_scatter, "ring_reduce_scatter"), (check_ring_all_gather, "ring_all_gather"),
    (check_ring_all_reduce, "ring_all_reduce"), (check_all_reduce_time, "all_reduce_time"),
])
def test_an_unwritten_exercise_says_so_with_its_hint(check, name):
    with pytest.raises(CheckFailed, match=f"^{name} is not written yet: .* Hint: n - 1 steps"):
        check(not_written)


def test_the_result_instead_of_the_function_is_explained():
    with pytest.raises(CheckFailed, match="needs your function itself"):
        check_ring_all_reduce(torch.ones(3))
    with pytest.raises(CheckFailed, match="needs your function itself"):
        check_all_reduce_time(0.5)


def waits_for_a_message_never_sent(x):
    dist.recv(torch.empty(1), (dist.get_rank() + 1) % 2)


def test_run_on_ranks_adds_the_hang_hint_to_a_deadlock_only():
    with pytest.raises(CheckFailed) as failed:
        run_on_ranks(waits_for_a_message_never_sent, [(1,)] * 2, exercise="demo",
                     hint="not this one", hang_hint="post the receive after the send", timeout=2)
    message = str(failed.value)
    assert message.startswith("demo: did not finish within 2 s on 2 ranks")
    assert message.endswith("\nHint: post the receive after the send")
    assert "not this one" not in message
