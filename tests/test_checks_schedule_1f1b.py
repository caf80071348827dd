"""Lesson 06's check of schedule_1f1b (`dlcourse/checks/pipeline/schedule_1f1b.py`), and the
reference 1F1B order held equal to a tick-by-tick simulation: the solutions and correct answers
written other ways pass; the wrong answers students write fail with a message naming the case, the
rank and a hint that says which mistake it was. Every run draws new cases, so each wrong answer here
fails on whatever is drawn."""

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

from checking import first_line_and_hint, starts
from dlcourse.checks.pipeline import schedule_1f1b as check_module
from dlcourse.checks.pipeline import check_schedule_1f1b


# --- exercise 4: the 1F1B action list, run -------------------------------------------------


def schedule_1f1b(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank - 1, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def schedule_1f1b_simulated(rank, n_stages, n_micro):
    """Every stage, one tick at a time: a backward when its gradient has arrived, else a forward
    when its input has and fewer than p - r micro-batches are in flight."""
    p, m = n_stages, n_micro
    forwarded, backwarded = [0] * p, [0] * p
    orders = [[] for _ in range(p)]
    while min(backwarded) < m:
        ran = []
        for r in range(p):
            i, j = backwarded[r], forwarded[r]
            if i < j and (r == p - 1 or backwarded[r + 1] > i):
                ran.append((r, "B", i))
            elif j < m and j - i < p - r and (r == 0 or forwarded[r - 1] > j):
                ran.append((r, "F", j))
        for r, kind, i in ran:  # this tick's results arrive at the next tick
            orders[r].append([kind, i])  # lists, not tuples: also accepted
            (forwarded if kind == "F" else backwarded)[r] += 1
    return orders[rank]


def warm_up_p_minus_rank(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_not_capped(rank, n_stages, n_micro):  # right while n_micro >= p - rank - 1
    warm_up = n_stages - rank - 1
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def backward_first_in_steady_state(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank - 1, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("B", i), ("F", warm_up + i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_of_rank(rank, n_stages, n_micro):  # the stages the wrong way round: waits forever
    warm_up = min(rank, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_for_four_stages(rank, n_stages, n_micro):
    warm_up = max(0, min(3 - rank, n_micro))
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def gpipe(rank, n_stages, n_micro):
    return [("F", i) for i in range(n_micro)] + [("B", i) for i in range(n_micro)]


def triples(rank, n_stages, n_micro):  # (stage, kind, i) as the lesson's Action prints
    return [(rank, kind, i) for kind, i in schedule_1f1b(rank, n_stages, n_micro)]


def course_library(rank, n_stages, n_micro):
    from dlcourse.parallel.pipeline import schedules
    return [(a.kind, a.mb) for a in schedules.one_f_one_b(rank, n_stages, n_micro)]


def torch_schedule(rank, n_stages, n_micro):
    torch_schedules.get_schedule_class("1F1B")
    return schedule_1f1b(rank, n_stages, n_micro)


def torch_schedule_captured(rank, n_stages, n_micro, _get=torch_schedules.get_schedule_class):
    _get("1F1B")  # bound when the cell ran, before the check: still refused
    return schedule_1f1b(rank, n_stages, n_micro)


def test_the_reference_1f1b_is_the_tick_simulation():
    for p in range(1, 7):
        for m in range(1, 15):
            for rank in range(p):
                assert check_module.one_f_one_b(rank, p, m) == \
                    [tuple(a) for a in schedule_1f1b_simulated(rank, p, m)]


@pytest.mark.parametrize("answer", [schedule_1f1b, schedule_1f1b_simulated])
def test_schedule_1f1b_passes(answer, capsys):
    check_schedule_1f1b(answer)
    assert "schedule_1f1b: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (warm_up_p_minus_rank, "rank ? holds", "the warm-up is p - rank - 1"),
    (gpipe, "rank ? holds", "the warm-up is p - rank - 1"),
    (warm_up_not_capped, "rank 0 runs actions[", "min(p - rank - 1, n_micro) forwards"),
    (backward_first_in_steady_state, "rank ? runs actions[", "a forward (the newest), then"),
    (warm_up_of_rank, "rank ? waits forever (deadlock): rank 0 at actions[", "follow 1F1B"),
    (warm_up_for_four_stages, "rank ?", ""),
    (triples, "rank 0 returned a list of items like (0, 'F', 0), expected a list of", ""),
    (course_library, "rank ? called one_f_one_b from dlcourse.parallel.pipeline.schedules", ""),
    (torch_schedule, "rank ? called get_schedule_class from "
                     "torch.distributed.pipelining.schedules", ""),
    (torch_schedule_captured, "rank ? called get_schedule_class from torch.distributed", ""),
])
def test_schedule_1f1b_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_schedule_1f1b, answer)
    assert first.startswith("schedule_1f1b with n_stages = "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)


def test_a_backward_before_its_forward_is_named_by_its_step():
    first, _ = first_line_and_hint(check_schedule_1f1b, backward_first_in_steady_state)
    # the last rank's warm-up is empty: its first action is the backward of micro-batch 0
    assert "actions[0] = ('B', 0), the backward of micro-batch 0, before its forward" in first
