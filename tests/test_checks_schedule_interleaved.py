"""Lesson 06's interleaved 1F1B check (`dlcourse/checks/pipeline/schedule_interleaved.py`): the
solution and an answer written another way pass on real ranks; the mistakes a student makes (B
before F in the steady state, a warm-up one too long or too short, a chunk missing, chunks in the
wrong order) fail with a message that names the rank and the mistake; the library's
`interleaved_1f1b` and the check's own references are refused. The verdict (`expect_interleaved`) is
also held, without ranks, on every (p, m, v) the check can draw, so a wrong answer fails whatever
the seed."""

import numpy as np
import pytest

from checking import first_line_and_hint
from dlcourse.checks.pipeline import schedule_interleaved as si
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.pipeline import check_schedule_interleaved
from dlcourse.parallel.pipeline.measure import bubble_fraction, in_flight_peak, simulate
from dlcourse.parallel.pipeline.schedules import interleaved_1f1b

EVERY_CASE = [(p, p * k, v) for p in (2, 3, 4) for k in (1, 2, 3) for v in (2, 3)]


def _orders(rank, p, m, v):
    """Forwards in groups of p micro-batches, chunk by chunk; backwards the same, chunks last
    to first."""
    fwd = [("F", c, g + j) for g in range(0, m, p) for c in range(v) for j in range(p)]
    bwd = [("B", c, g + j) for g in range(0, m, p) for c in reversed(range(v)) for j in range(p)]
    return fwd, bwd


def interleaved(rank, n_stages, n_micro, v, extra=0, backward_first=False):
    fwd, bwd = _orders(rank, n_stages, n_micro, v)
    warm = max(0, min(2 * (n_stages - rank - 1) + (v - 1) * n_stages + extra, len(fwd)))
    out = fwd[:warm]
    for k in range(len(fwd) - warm):
        out += [bwd[k], fwd[warm + k]] if backward_first else [fwd[warm + k], bwd[k]]
    return out + bwd[len(fwd) - warm:]


def schedule_interleaved(rank, n_stages, n_micro, v):  # the solution notebook's, as a student
    return interleaved(rank, n_stages, n_micro, v)


def interleaved_by_rule(rank, n_stages, n_micro, v):
    """Another way: numpy ints, a tuple, and each next action chosen by a rule: a forward while
    the rank holds fewer than its warm-up + 1 chunk activations, else the oldest backward."""
    p, total = n_stages, n_micro * v
    cap = min(2 * (p - rank - 1) + (v - 1) * p + 1, total)
    group = p * v
    fwd = [("F", np.int64(k % group // p), np.int64(k // group * p + k % p))
           for k in range(total)]
    bwd = [("B", np.int64(v - 1 - k % group // p), np.int64(k // group * p + k % p))
           for k in range(total)]
    out, f, b = [], 0, 0
    while b < total:
        if f < total and f - b < cap:
            out.append(fwd[f])
            f += 1
        else:
            out.append(bwd[b])
            b += 1
    return tuple(out)


def warm_up_too_long(rank, n_stages, n_micro, v):
    return interleaved(rank, n_stages, n_micro, v, extra=1)


def warm_up_too_short(rank, n_stages, n_micro, v):
    return interleaved(rank, n_stages, n_micro, v, extra=-1)


def warm_up_of_1f1b(rank, n_stages, n_micro, v):  # 1F1B's p - rank - 1, chunks forgotten
    return interleaved(rank, n_stages, n_micro, v,
                       extra=(n_stages - rank - 1) - (2 * (n_stages - rank - 1)
                                                      + (v - 1) * n_stages))


def backward_then_forward(rank, n_stages, n_micro, v):  # steady state: B before F
    return interleaved(rank, n_stages, n_micro, v, backward_first=True)


def last_chunk_missing(rank, n_stages, n_micro, v):
    return [a for a in interleaved(rank, n_stages, n_micro, v) if a[1] != v - 1]


def chunk_by_chunk(rank, n_stages, n_micro, v):  # every micro-batch through chunk 0 first
    fwd = [("F", c, i) for c in range(v) for i in range(n_micro)]
    bwd = [("B", c, i) for c in reversed(range(v)) for i in range(n_micro)]
    warm = min(2 * (n_stages - rank - 1) + (v - 1) * n_stages, len(fwd))
    out = fwd[:warm]
    for k in range(len(fwd) - warm):
        out += [fwd[warm + k], bwd[k]]
    return out + bwd[len(fwd) - warm:]


def library(rank, n_stages, n_micro, v):
    return [(a.kind, a.stage // n_stages, a.mb)
            for a in interleaved_1f1b(rank, n_stages, n_micro, v)]


def check_reference(rank, n_stages, n_micro, v):
    si.expected_warm_up(rank, n_stages, n_micro, v)
    return schedule_interleaved(rank, n_stages, n_micro, v)


def lists(fn, p, m, v):
    return [[tuple(int(x) if not isinstance(x, str) else x for x in a)
             for a in fn(r, p, m, v)] for r in range(p)]


# --- the formulas the check holds a schedule to, on the library's schedule ------------------


@pytest.mark.parametrize("p, m, v", EVERY_CASE)
def test_the_formulas_are_the_librarys_interleaved_1f1b_simulated(p, m, v):
    by_rank = {r: interleaved_1f1b(r, p, m, v) for r in range(p)}
    assert abs(bubble_fraction(simulate(by_rank)) - si.expected_bubble(p, m, v)) < si.BUBBLE_TOL
    assert [in_flight_peak(by_rank[r]) for r in range(p)] == \
        [si.expected_peak(r, p, m, v) for r in range(p)]
    assert lists(schedule_interleaved, p, m, v) == lists(library, p, m, v)


@pytest.mark.parametrize("answer", [schedule_interleaved, interleaved_by_rule])
def test_right_answers_pass_the_verdict_on_every_case(answer):
    for p, m, v in EVERY_CASE:
        si.expect_interleaved(lists(answer, p, m, v), p, m, v, "case")


WRONG = [
    (warm_up_too_long, "holds", "warm-up too long"),
    (warm_up_too_short, "", "warm-up too short"),  # a bubble, or a B before its own F
    (warm_up_of_1f1b, "", "warm-up too short"),
    (backward_then_forward, "", "warm-up too short"),  # its first F1B is a B1F
    (last_chunk_missing, "never runs", "each of the rank's v chunks"),
    (chunk_by_chunk, "", "groups of p micro-batches"),
]


@pytest.mark.parametrize("answer, says, hint", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_answers_fail_the_verdict_on_every_case(answer, says, hint):
    for p, m, v in EVERY_CASE:
        if answer is chunk_by_chunk and m == p:  # one group: the same list as the right one
            continue
        with pytest.raises(CheckFailed) as failed:
            si.expect_interleaved(lists(answer, p, m, v), p, m, v, "case")
        first, _, rest = str(failed.value).partition("\n")
        assert says in first and hint in rest, (p, m, v, str(failed.value))


# --- on real ranks ---------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [schedule_interleaved, interleaved_by_rule])
def test_right_answers_pass_on_ranks(answer, capsys):
    check_schedule_interleaved(answer)
    assert "schedule_interleaved: passed on 3 cases" in capsys.readouterr().out


def test_a_warm_up_too_long_fails_on_ranks_naming_the_rank():
    first, hint = first_line_and_hint(check_schedule_interleaved, warm_up_too_long)
    rank = first.split(": rank ")[1].split()[0]  # rank 0 unless its warm-up is capped at v m
    assert f"rank {rank} holds" in first and "chunk activations at once" in first
    assert hint.startswith(f"warm-up too long: rank {rank} runs")


def test_a_backward_before_its_forward_is_named_by_its_step():
    def backward_first(rank, n_stages, n_micro, v):
        out = interleaved(rank, n_stages, n_micro, v)
        b = next(k for k, a in enumerate(out) if a[0] == "B")
        return [out[b]] + out[:b] + out[b + 1:]

    with pytest.raises(CheckFailed, match=r"runs actions\[0\] = \('B', \d, 0\) before its "
                                          "forward"):
        si.expect_interleaved(lists(backward_first, 3, 6, 2), 3, 6, 2, "case")


def test_a_deadlock_is_named():
    def wrong_chunk_order(rank, n_stages, n_micro, v):  # backward chunks first to last
        return [(k, c if k == "F" else v - 1 - c, i)
                for k, c, i in interleaved(rank, n_stages, n_micro, v)]

    with pytest.raises(CheckFailed, match="waits forever"):
        si.expect_interleaved(lists(wrong_chunk_order, 2, 4, 2), 2, 4, 2, "case")


@pytest.mark.parametrize("answer, says", [
    (library, "called interleaved_1f1b from dlcourse.parallel.pipeline.schedules"),
    (check_reference, "called expected_warm_up from dlcourse.checks.pipeline.schedule_interleaved"),
])
def test_the_library_and_the_checks_references_are_refused(answer, says):
    first, _ = first_line_and_hint(check_schedule_interleaved, answer)
    assert says in first and "which this exercise does not allow" in first


def test_the_refusal_ends_with_the_student_code():
    with ANSWERS.refusing():
        with pytest.raises(Exception, match="does not allow"):
            si.expected_warm_up(0, 2, 2, 2)
    assert si.expected_warm_up(0, 2, 2, 2) == 4
    assert interleaved_1f1b(0, 2, 2, 2)  # the library works again too
