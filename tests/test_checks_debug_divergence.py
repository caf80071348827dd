"""Lesson 10, exercise 1 (`dlcourse/checks/debug/first_divergence.py`): the first place a rank's
trace parts from the one-process reference, on real 2-rank runs with bugs of the catalogue. A
comparison written another way (numpy, torch.allclose, a dict or a dataclass as the answer)
passes; an exact comparison (rounding counted), reading only the parameters, naming the largest
gap or walking the gradients in the model's order (a later layer) fail with the hint that names
the mistake; the lesson's finder is refused.

The runs launch once per process (`runs.all_traces`); every check call draws its own cases among
them (a failure names the seed)."""

import functools
from dataclasses import dataclass

import numpy as np
import pytest

from checking import first_line_and_hint, starts
from dlcourse.checks.debug import check_first_divergence


def first_divergence(reference, parallel, tolerance):
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name, want in ref.items():
            if (mine[name] - want).abs().max() > tolerance * max(1.0, want.abs().max().item()):
                return step, phase, name
    return None


def in_numpy_as_a_dict(reference, parallel, tolerance):  # numpy numbers, a dict, an int64 step
    for i, (step, phase, ref) in enumerate(reference):
        for name in ref:
            want, got = ref[name].numpy(), parallel[i][2][name].numpy()
            if np.abs(got - want).max() > tolerance * max(1.0, np.abs(want).max()):
                return {"step": np.int64(step), "phase": phase.upper(), "name": name}
    return None


@dataclass
class Place:
    step: int
    phase: str
    name: str


def with_allclose(reference, parallel, tolerance):  # torch.allclose, a dataclass
    import torch
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name, want in ref.items():
            atol = tolerance * max(1.0, want.abs().max().item())
            if not torch.allclose(mine[name], want, rtol=0, atol=atol):
                return Place(step, phase, name)
    return None


def exact(reference, parallel, tolerance):  # rounding counted as a bug
    import torch
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name, want in ref.items():
            if not torch.equal(mine[name], want):
                return step, phase, name
    return None


def parameters_only(reference, parallel, tolerance):
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        if not phase.startswith("parameters"):
            continue
        for name, want in ref.items():
            if (mine[name] - want).abs().max() > tolerance * max(1.0, want.abs().max().item()):
                return step, phase, name
    return None


def largest_gap(reference, parallel, tolerance):
    best = None
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name, want in ref.items():
            diff = (mine[name] - want).abs().max().item()
            if diff > tolerance * max(1.0, want.abs().max().item()):
                if best is None or diff > best[0]:
                    best = (diff, (step, phase, name))
    return best and best[1]


def gradients_in_model_order(reference, parallel, tolerance):  # a later layer than the first
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name in sorted(ref) if phase == "gradients" else ref:
            want = ref[name]
            if (mine[name] - want).abs().max() > tolerance * max(1.0, want.abs().max().item()):
                return step, phase, name
    return None


def with_the_lesson(reference, parallel, tolerance):
    from dlcourse.debug.compare import compare_trace
    return compare_trace(reference, parallel, [], None, None)


def test_the_solution_and_other_phrasings_pass(capsys):
    for answer in (first_divergence, in_numpy_as_a_dict, with_allclose):
        check_first_divergence(answer)
    assert capsys.readouterr().out.count("first_divergence: passed on 4 runs") == 3


@pytest.mark.parametrize("answer, says, hint", [
    (exact, "first_divergence on rank ", "never with 0"),
    (parameters_only, "first_divergence on rank ", "compare every phase"),
    (largest_gap, "first_divergence on rank ", ""),
    (gradients_in_model_order, "first_divergence on rank ", ""),
])
def test_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_first_divergence, answer)
    assert starts(first, says), first
    assert hint in got_hint, got_hint
    if answer is exact:
        assert "within the tolerance" in first or "it is equal" in first, first
    if answer in (largest_gap, gradients_in_model_order):
        assert "an earlier tensor differs already" in first, first


def test_the_lessons_finder_is_refused():
    first, _ = first_line_and_hint(check_first_divergence, with_the_lesson)
    assert "called compare_trace from dlcourse.debug.compare" in first, first


def from_the_case_name(reference, parallel, tolerance, _table=None):
    # a submission reading the case's name up its rank's stack ("rank 1's traces of X with bug
    # 'b'"), answered from a table of first places (a student collects one from failures)
    import re
    import sys
    frame = sys._getframe(1)
    while frame is not None and "where" not in frame.f_locals:
        frame = frame.f_back
    found = re.search(r"rank (\d)'s traces of (.+?)(?: with bug '(\w+)'| \(correct\))",
                      frame.f_locals["where"] if frame else "")
    return _table.get(found.groups()) if found else ("no", "case", "name")


def test_a_submission_cannot_read_the_case_s_name_in_its_rank():
    from dlcourse import pickling
    from dlcourse.checks.core import Submitted
    from dlcourse.checks.debug.reference import first_gap
    from dlcourse.checks.debug.runs import all_traces
    table = {(str(r), name, bug): first_gap(*per_rank[r])
             for (name, bug), per_rank in all_traces().items() for r in range(2)}
    answer = functools.partial(from_the_case_name, _table=table)
    first, _ = first_line_and_hint(check_first_divergence,
                                   Submitted("first_divergence", pickling.dumps(answer)))
    assert "('no', 'case', 'name')" in first, first


def _fingerprint(trace):  # the last parameters' sum: the nudges (1e-14) leave it to 8 digits
    _, _, tensors = trace[-1]
    return round(sum(float(t.double().sum()) for t in tensors.values()), 8)


def from_a_table_of_the_runs(reference, parallel, tolerance, _table=None):
    return _table.get(_fingerprint(parallel), ("not", "in the", "table"))


def test_the_runs_weights_are_drawn_afresh_so_a_table_of_them_fails():
    from dlcourse.checks.debug.reference import first_gap
    from dlcourse.checks.debug.runs import all_traces
    table = {_fingerprint(per_rank[r][1]): first_gap(*per_rank[r])  # what failures tell
             for per_rank in all_traces().values() for r in range(2)}
    answer = functools.partial(from_a_table_of_the_runs, _table=table)
    first, _ = first_line_and_hint(check_first_divergence, answer)
    assert "('not', 'in the', 'table')" in first, first


def test_a_dataclass_place_passes_when_graded(capsys):  # the rank sends back data only
    from dlcourse import pickling
    from dlcourse.checks.core import Submitted
    check_first_divergence(Submitted("first_divergence", pickling.dumps(with_allclose)))
    assert "first_divergence: passed on 4 runs" in capsys.readouterr().out
