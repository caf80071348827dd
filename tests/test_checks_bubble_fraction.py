"""Lesson 06's check of bubble_fraction (`dlcourse/checks/pipeline/bubble_fraction.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn. A table of one run's answers fails on
the next."""

import types
from fractions import Fraction

import pytest

from checking import first_line_and_hint, starts
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.pipeline import check_bubble_fraction, check_stage_boundaries


# --- exercise 5: the bubble ----------------------------------------------------------------


def bubble_fraction(n_stages, n_micro):
    return (n_stages - 1) / (n_micro + n_stages - 1)


def bubble_fraction_busy_first(n_stages, n_micro):  # 1 - busy share, as an exact fraction
    return 1 - Fraction(n_micro, n_micro + n_stages - 1)


def bubble_over_compute(n_stages, n_micro):
    return (n_stages - 1) / n_micro


def bubble_for_four_stages(n_stages, n_micro):
    return 3 / (n_micro + 3)


def busy_share(n_stages, n_micro):
    return n_micro / (n_micro + n_stages - 1)


def bubble_from_the_library(n_stages, n_micro):
    from dlcourse.parallel.pipeline import measure
    return measure.bubble_formula("1F1B", n_stages, n_micro)


@pytest.mark.parametrize("answer", [bubble_fraction, bubble_fraction_busy_first])
def test_bubble_fraction_passes(answer, capsys):
    check_bubble_fraction(answer)
    assert "bubble_fraction: passed" in capsys.readouterr().out


def test_the_course_librarys_answers_are_refused():
    from dlcourse.parallel.pipeline.stages import stage_boundaries as library_boundaries

    copy = types.FunctionType(library_boundaries.__code__, library_boundaries.__globals__)
    for check, answer, refused in [
            (check_stage_boundaries, lambda n, p: copy(n, p),  # a copy made before the check
             "stage_boundaries from dlcourse.parallel.pipeline.stages"),
            (check_bubble_fraction, bubble_from_the_library,
             "bubble_formula from dlcourse.parallel.pipeline.measure"),
            (check_stage_boundaries, lambda n, p, _captured=library_boundaries: _captured(n, p),
             "stage_boundaries from dlcourse.parallel.pipeline.stages")]:
        first, _ = first_line_and_hint(check, answer)
        assert f"called {refused}, which this exercise does not allow" in first, first


@pytest.mark.parametrize("answer, hint", [
    (bubble_over_compute, "idle time over the busy time"),
    (bubble_for_four_stages, "idle / (idle + busy)"),
    (busy_share, "busy share"),
])
def test_bubble_fraction_wrong_answers_fail(answer, hint):
    first, got_hint = first_line_and_hint(check_bubble_fraction, answer)
    assert starts(first, "bubble_fraction(n_stages=") and "the simulated timeline" in first
    assert hint in got_hint, got_hint


# --- an answer that replays one run's cases ------------------------------------------------


def test_a_table_of_one_runs_answers_fails_on_the_next_run():
    """A student who records the grader's cases and returns a table passes only the run it
    recorded: the next run draws other cases (all 6 inside the table: about 1 in 10^6)."""
    table = {}

    def recording(n_stages, n_micro):
        table[n_stages, n_micro] = bubble_fraction(n_stages, n_micro)
        return table[n_stages, n_micro]

    def replay(n_stages, n_micro):
        return table.get((n_stages, n_micro), 0.5)

    check_bubble_fraction(recording, seed=1)
    check_bubble_fraction(replay, seed=1)  # the recorded run
    with pytest.raises(CheckFailed, match="returned 0.5"):
        check_bubble_fraction(replay)
