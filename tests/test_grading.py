"""Lesson 00's checks and the core under them, on real gloo ranks: the wrong answers students
write fail with a message naming the rank and the problem, a deadlock fails in seconds with no
process left, and a forbidden collective is caught. (That the solutions pass is proven where
they are: solutions/00_launch.ipynb under nbval, and graded in tests/test_checks_bytes_received.py
and tests/test_grading_cli.py.)"""

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import all_reduce as imported_all_reduce

from conftest import wait_gone
from dlcourse.checks.core import (
    COLLECTIVES, CheckFailed, expect_tensor, random_tensor, run_on_ranks,
)
from dlcourse.checks.core import ranks
from dlcourse.checks.launch import check_gather_all, check_sum_to_rank0


# --- gather_all: the wrong answers students write ------------------------------------------

def gather_without_communicating(x):  # "every rank has x, so stack it": only its own
    return torch.stack([x] * dist.get_world_size())


def gather_into_float_buffers(x):  # torch.empty(x.shape) is float32 whatever x is
    out = [torch.empty(x.shape) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.stack(out)


def gather_concatenated(x):  # torch.cat flattens the rank axis into the first dim
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.cat(out)


def gather_assuming_4_ranks(x):  # works in the notebook's 4-rank example only
    out = [torch.empty_like(x) for _ in range(4)]
    dist.all_gather(out, x)
    return torch.stack(out)


@pytest.mark.parametrize("wrong, says", [
    (gather_without_communicating, "rank 0 returned wrong values: element [1, 0] is"),
    (gather_into_float_buffers, "gather_all on 3 ranks, x: int64 tensor of shape (2, 5): rank"),
    (gather_concatenated, "rank 0 returned shape (12,), expected (4, 3)"),
    (gather_assuming_4_ranks, "gather_all on 3 ranks, x: int64 tensor of shape (2, 5): rank"),
])
def test_gather_all_rejects_plausible_wrong_answers(wrong, says):
    with pytest.raises(CheckFailed) as failed:
        check_gather_all(wrong)
    assert says in str(failed.value)
    assert "\nHint: make a list of world_size tensors" in str(failed.value)


def test_a_wrong_element_is_named_with_expected_and_got():
    with pytest.raises(CheckFailed) as failed:
        check_gather_all(gather_without_communicating)
    first = str(failed.value).splitlines()[0]
    assert first.startswith("gather_all on 4 ranks, x: float32 tensor of shape (3,): rank 0 ")
    assert "expected" in first and "(9 of 12 differ)" in first  # 3 rows of 4 are another rank's
    assert "Hint: " in str(failed.value)


# --- sum_to_rank0 ---------------------------------------------------------------------------

def sum_in_place(x):  # reduce overwrites the caller's tensor
    dist.reduce(x, dst=0)
    return x if dist.get_rank() == 0 else None


def sum_on_every_rank(x):  # forgets that only rank 0 returns it
    total = x.clone()
    dist.reduce(total, dst=0)
    return total


def sum_with_all_reduce(x):  # right values, but sends the sum to every rank
    total = x.clone()
    dist.all_reduce(total)
    return total if dist.get_rank() == 0 else None


def sum_of_own_elements(x):  # "a sum": of x's elements, on one rank, no communication
    return x.sum() if dist.get_rank() == 0 else None


@pytest.mark.parametrize("wrong, says", [
    (sum_in_place, "rank 0 changed x in place"),
    (sum_on_every_rank, "rank 1 returned float32 tensor of shape (5,), expected None"),
    (sum_with_all_reduce, "called dist.all_reduce, which this exercise does not allow"),
    (sum_of_own_elements, "rank 0 returned shape (), expected (5,)"),
])
def test_sum_to_rank0_rejects_plausible_wrong_answers(wrong, says):
    with pytest.raises(CheckFailed) as failed:
        check_sum_to_rank0(wrong)
    assert says in str(failed.value)


# --- the core: unwritten, crashing, deadlocked and forbidden functions ----------------------

def not_written(x):
    raise NotImplementedError("Hint: one all_gather")


def started_then_stopped(x):
    print("working on it")  # not a bare stub: it runs on the ranks, and says the same
    raise NotImplementedError("Hint: one all_gather")


@pytest.mark.parametrize("stub, ranks_started", [(not_written, False),
                                                 (started_then_stopped, True)])
def test_an_unwritten_exercise_says_so_with_its_hint(stub, ranks_started, monkeypatch):
    # A body that can only raise is answered here, without starting ranks; anything more runs.
    launches = []
    for name in ("launch_watched", "launch_as_data"):  # how a check starts ranks (checks/core)
        launch = getattr(ranks, name)
        monkeypatch.setattr(ranks, name, lambda *a, _launch=launch, **k:
                            launches.append(1) or _launch(*a, **k))
    with pytest.raises(CheckFailed, match="gather_all is not written yet: .* Hint: one all_gather"):
        check_gather_all(stub)
    assert bool(launches) == ranks_started


def test_a_rank_that_raises_is_named_with_its_traceback():
    def rank_2_fails(x):
        if dist.get_rank() == 2:
            raise KeyError("oops")
        return x

    with pytest.raises(CheckFailed) as failed:
        run_on_ranks(rank_2_fails, [(1,)] * 3, exercise="demo")
    assert str(failed.value).startswith("demo: rank 2 raised KeyError: 'oops'")
    assert "in rank_2_fails" in str(failed.value)  # the student's own frame


def test_passing_the_result_instead_of_the_function_is_explained():
    with pytest.raises(CheckFailed, match="needs your function itself"):
        check_gather_all(torch.ones(2))  # check_gather_all(gather_all(x)) instead of (gather_all)


def deadlocks_and_reports_pid(x, folder):
    with open(os.path.join(folder, str(dist.get_rank())), "w") as f:
        f.write(str(os.getpid()))
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    if dist.get_rank() != 0:  # rank 0 skips the collective: the others wait for it forever
        dist.all_gather(out, x)
    return torch.stack(out)


def test_a_deadlock_fails_in_seconds_and_leaves_no_process(tmp_path):
    start = time.monotonic()
    with pytest.raises(CheckFailed) as failed:
        run_on_ranks(deadlocks_and_reports_pid, [(torch.ones(2), str(tmp_path))] * 3,
                     exercise="gather_all", timeout=2)
    assert time.monotonic() - start < 10
    message = str(failed.value)
    assert "did not finish within 2 s on 3 ranks (still running: ranks 1, 2)" in message
    assert "a collective that not every rank calls" in message
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 3 and not wait_gone(pids, seconds=10)


def ring_sum(x):
    """All-reduce from send/recv: each step passes right the piece received the step before."""
    rank, size = dist.get_rank(), dist.get_world_size()
    total, piece = x.clone(), x.clone()
    for _ in range(size - 1):
        incoming = torch.empty_like(x)
        request = dist.isend(piece, (rank + 1) % size)
        dist.recv(incoming, (rank - 1) % size)
        request.wait()
        total += incoming
        piece = incoming
    return total


def sum_with_collective(x):
    total = x.clone()
    dist.all_reduce(total)
    return total


def sum_with_imported_collective(x):
    total = x.clone()
    imported_all_reduce(total)
    return total


def _ring_check(fn):
    xs = [torch.tensor([float(r), 1.0]) for r in range(3)]
    return run_on_ranks(fn, [(x,) for x in xs], exercise="ring", forbid=COLLECTIVES,
                        why_forbidden="build it from send and recv")


def test_send_and_recv_are_allowed_when_collectives_are_forbidden():
    assert all(torch.equal(value, torch.tensor([3.0, 3.0])) for value, _ in _ring_check(ring_sum))


@pytest.mark.parametrize("fn", [sum_with_collective, sum_with_imported_collective])
def test_a_forbidden_collective_fails_the_check_however_it_is_imported(fn):
    with pytest.raises(CheckFailed, match="called dist.all_reduce, which this exercise does not "
                                          "allow: build it from send and recv"):
        _ring_check(fn)


def test_the_guard_is_lifted_after_the_student_function():
    # Under torchrun, launch runs in the rank's own process: the guard must not outlive the check.
    def check_then_all_reduce():
        run_on_ranks(ring_sum, [(torch.ones(1),)] * 2, exercise="ring", forbid=COLLECTIVES)
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    from dlcourse import launch
    assert launch(check_then_all_reduce, world_size=2, backend="gloo") == [2.0, 2.0]


# --- comparisons, without ranks -------------------------------------------------------------

def test_expect_tensor_names_type_shape_dtype_element_and_tolerance():
    want = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    cases = [
        ([1, 2], "rank 1 returned a list, expected float32 tensor of shape (2, 2)"),
        (want.flatten(), "returned shape (4,), expected (2, 2)"),
        (want.double(), "returned dtype float64, expected float32"),
        (want + torch.tensor([[0.0, 0.0], [0.5, 0.0]]),
         "element [1, 0] is 3.5, expected 3.0 (1 of 4"),
    ]
    for got, says in cases:
        with pytest.raises(CheckFailed) as failed:
            expect_tensor(got, want, where="demo", rank=1, atol=1e-3, tolerance="1e-3 (why)")
        assert says in str(failed.value)
    expect_tensor(want + 1e-4, want, where="demo", rank=1, atol=1e-3)  # inside the tolerance
    with pytest.raises(CheckFailed, match="allowed difference 1e-3 \\(why\\)"):
        expect_tensor(want + 1, want, where="demo", rank=1, atol=1e-3, tolerance="1e-3 (why)")


def test_random_inputs_are_reproducible_and_keep_their_dtype():
    a, b = random_tensor((2, 3), torch.int64, seed=5), random_tensor((2, 3), torch.int64, seed=5)
    assert a.dtype == torch.int64 and torch.equal(a, b)
    assert not torch.equal(random_tensor((5,), torch.float32, seed=1),
                           random_tensor((5,), torch.float32, seed=2))
