"""Lesson 07's check of step_collectives (`dlcourse/checks/combine/step_collectives.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn."""

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine import check_step_collectives


# --- exercise 3: step_collectives ------------------------------------------------------------

TABLE = {"pp": {"pipeline": ("send", "recv")},
         "dp": {"data": ("all_reduce",), "zero": ("reduce_scatter", "all_gather")},
         "tp": {"tensor": ("all_reduce",), "sp": ("all_gather", "reduce_scatter"),
                "last stage": ("all_gather",)}}


def collectives_by_table(dp, tp, pp, zero_stage, sequence_parallel):  # frozensets, a table
    used = {"pp": ["pipeline"] * (pp > 1),
            "dp": ([("zero" if zero_stage else "data")] if dp > 1 else []),
            "tp": (["tensor"] + ["sp"] * sequence_parallel + ["last stage"] * (pp > 1)
                   if tp > 1 else [])}
    return {axis: frozenset(op for s in kinds for op in TABLE[axis][s])
            for axis, kinds in used.items()}


def _rules(dp, tp, pp, zero_stage, sequence_parallel):
    out = {"pp": [], "dp": [], "tp": []}
    if pp > 1:
        out["pp"] += ["send", "recv"]
    if dp > 1:
        out["dp"] += ["reduce_scatter", "all_gather"] if zero_stage > 0 else ["all_reduce"]
    if tp > 1:
        out["tp"] += ["all_reduce"] + ["all_gather"] * (pp > 1 or sequence_parallel) \
            + ["reduce_scatter"] * sequence_parallel
    return out  # lists, with a name twice sometimes: the names are what counts


def collectives_zero_on_tp(dp, tp, pp, zero_stage, sequence_parallel):  # ZeRO's ops on tp
    out = {k: set(v) for k, v in _rules(dp, tp, pp, zero_stage, sequence_parallel).items()}
    if zero_stage and dp > 1 and tp > 1:
        out["tp"] |= {"reduce_scatter", "all_gather"}
        out["dp"] = {"all_reduce"}
    return out


def collectives_zero_all_reduce(dp, tp, pp, zero_stage, sequence_parallel):
    out = {k: set(v) for k, v in _rules(dp, tp, pp, zero_stage, sequence_parallel).items()}
    if dp > 1:
        out["dp"] = {"all_reduce"}
    return out


def collectives_size_one_talks(dp, tp, pp, zero_stage, sequence_parallel):
    return _rules(max(dp, 2), max(tp, 2), max(pp, 2), zero_stage, sequence_parallel)


def collectives_axes_swapped(dp, tp, pp, zero_stage, sequence_parallel):
    out = _rules(dp, tp, pp, zero_stage, sequence_parallel)
    return {"pp": out["pp"], "dp": out["tp"], "tp": out["dp"]}


@pytest.mark.parametrize("answer", [_rules, collectives_by_table])
def test_step_collectives_passes_correct_answers(answer, capsys):
    check_step_collectives(answer)
    assert "step_collectives: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (collectives_zero_on_tp, "ZeRO shards the model state over the data-parallel replicas"),
    (collectives_zero_all_reduce, "reduce-scatter"),
    (collectives_size_one_talks, "size 1"),
    (collectives_axes_swapped, ""),
])
def test_step_collectives_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_step_collectives, answer)
    assert first.startswith("step_collectives(") and "expected" in first, first
    assert hint in got_hint, got_hint
