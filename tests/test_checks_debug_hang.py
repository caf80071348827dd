"""Lesson 10, exercise 2 (`dlcourse/checks/debug/mismatched_call.py`): from the per-rank collective
traces of a real 4-rank job broken on one rank, the rank and the call the others wait for. Another
way of lining the ranks up (pairwise against the majority, a dict or numpy numbers as the answer)
passes; taking rank 0 as the model, comparing the traces' lengths or ops only, counting from 0
(a list's index, where the course counts calls from 1 as torch's flight recorder does) and naming
the others' call instead of the odd rank's fail with the hint that names the mistake; the
lesson's hang finder is refused. The job's traces are recorded once per process (`runs.py`)."""

from collections import Counter

import numpy as np
import pytest

from checking import first_line_and_hint, starts
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.debug import check_mismatched_call


def _call(calls, index):
    return (calls[index]["op"], calls[index]["nbytes"]) if index < len(calls) else None


def mismatched_call(traces):
    for index in range(max(len(calls) for calls in traces.values())):
        made = {rank: _call(calls, index) for rank, calls in traces.items()}
        kinds = Counter(made.values())
        if len(kinds) > 1:
            rank = next(r for r, k in made.items() if kinds[k] == 1)
            return (rank, index + 1) + (made[rank] or (None, None))
    return None


def pairwise_as_a_dict(traces):  # each rank against the others, numpy numbers, a dict
    ranks = sorted(traces)
    index = 0
    while len({_call(traces[r], index) for r in ranks}) == 1:
        index += 1
    for rank in ranks:
        mine = _call(traces[rank], index)
        if all(_call(traces[other], index) != mine for other in ranks if other != rank):
            op, nbytes = mine or (None, None)
            return {"rank": np.int64(rank), "call": np.int64(index + 1), "op": op,
                    "nbytes": None if nbytes is None else np.int64(nbytes)}


def rank_zero_as_the_model(traces):
    for index in range(max(len(calls) for calls in traces.values())):
        for rank in sorted(traces)[1:]:
            if _call(traces[rank], index) != _call(traces[0], index):
                return (rank, index + 1) + (_call(traces[rank], index) or (None, None))


def lengths_only(traces):
    lengths = Counter(len(calls) for calls in traces.values())
    rank = next((r for r, c in traces.items() if lengths[len(c)] == 1), 0)
    index = min(lengths)
    return (rank, index + 1) + (_call(traces[rank], index) or (None, None))


def ops_only(traces):
    for index in range(max(len(calls) for calls in traces.values())):
        made = {r: (_call(c, index) or (None,))[0] for r, c in traces.items()}
        kinds = Counter(made.values())
        if len(kinds) > 1:
            rank = next(r for r, k in made.items() if kinds[k] == 1)
            return (rank, index + 1) + (_call(traces[rank], index) or (None, None))


def counted_from_zero(traces):  # the list's index, not the call's number
    rank, number, op, nbytes = mismatched_call(traces)
    return rank, number - 1, op, nbytes


def the_others_call(traces):
    rank, number, _, _ = mismatched_call(traces)
    other = next(r for r in traces if r != rank)
    return (rank, number) + (_call(traces[other], number - 1) or (None, None))


def with_the_lesson(traces):
    from dlcourse.debug import find_hang
    return find_hang(traces)


def test_the_solution_and_another_way_pass(capsys):
    for answer in (mismatched_call, pairwise_as_a_dict):
        check_mismatched_call(answer)
    assert capsys.readouterr().out.count("mismatched_call: passed on 5 hangs") == 2


@pytest.mark.parametrize("answer, says, hint", [
    (rank_zero_as_the_model, "returned rank ", "rank 0 can be the odd one too"),
    (lengths_only, "returned ", ""),
    (ops_only, "returned ", "op and nbytes"),
    (counted_from_zero, "returned call ", "count from 1"),
    (the_others_call, "returned (", ""),
])
def test_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_mismatched_call, answer)
    assert first.startswith("mismatched_call on 4 ranks' traces"), first
    assert starts(first.split("): ", 1)[1], says), first
    assert hint in got_hint, got_hint


def test_the_lessons_finder_is_refused():
    first, _ = first_line_and_hint(check_mismatched_call, with_the_lesson)
    assert "called find_hang from dlcourse.debug.hang" in first, first


def test_a_submission_passes_when_graded(capsys):
    """As `dlcourse grade` runs it: on a rank, the dict of numpy numbers read back as data."""
    check_mismatched_call(Submitted("mismatched_call", pickling.dumps(pairwise_as_a_dict)))
    assert "mismatched_call: passed" in capsys.readouterr().out


def from_the_checks_frame(traces):  # called here (a notebook's grader cell): the check's locals
    import sys
    frame = sys._getframe(1)
    while frame is not None and "want" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["want"] if frame else None


def test_the_answer_is_found_after_the_student_s_function_returned():
    first, _ = first_line_and_hint(check_mismatched_call, from_the_checks_frame)
    assert "returned None, but the ranks disagree" in first, first
