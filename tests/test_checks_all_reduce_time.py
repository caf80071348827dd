"""Lesson 02's check of all_reduce_time (`dlcourse/checks/collectives/all_reduce_time.py`): the cost
model's wrong formulas fail, each naming the term it got wrong; then what every lesson-02 check does
with an unwritten or misused function, and the core's hang hint."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.collectives
from dlcourse.collectives import predict_time

from checking import first_line_and_message
from dlcourse.checks.collectives import (
    check_all_reduce_time, check_ring_all_gather, check_ring_all_reduce,
    check_ring_reduce_scatter,
)
from dlcourse.checks.core import CheckFailed, run_on_ranks


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


# --- all_reduce_time ------------------------------------------------------------------------

FIRST_TIME = "all_reduce_time(nbytes=4,194,304, world_size=4, alpha=0.0001, beta=5e-10): "


def test_all_reduce_time_solution_passes(capsys):
    check_all_reduce_time(all_reduce_time)
    assert "all_reduce_time: passed on 6 cases" in capsys.readouterr().out


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
    first, message = first_line_and_message(check_all_reduce_time, wrong)
    assert first == (FIRST_TIME + f"returned {got} s, the alpha-beta model of a ring all-reduce "
                                  "gives 0.00374573 s")
    assert hint in message.split("\nHint: ", 1)[1]


@pytest.mark.parametrize("wrong, says", [
    (time_with_the_library, "called predict_time from dlcourse.collectives.cost, which this "
                            "exercise does not allow"),
    (time_with_the_table, "used dlcourse.collectives.ALGORITHMS, which this exercise does not "
                          "allow"),
])
def test_the_lessons_cost_model_is_refused_and_put_back(wrong, says):
    first, _ = first_line_and_message(check_all_reduce_time, wrong)
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
