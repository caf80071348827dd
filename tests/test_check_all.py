"""`check_all` (`dlcourse/checks/summary.py`): every grader of an exercise notebook run from inside
it, one table, nothing stopping at the first failure."""

import torch
import torch.distributed as dist

from dlcourse.checks.summary import check_all, format_rows
from dlcourse.grading.notebooks import grader_cells, read


def gather_all(x):
    out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return torch.stack(out)


def sum_to_rank0(x):  # wrong: every rank returns the sum
    total = x.clone()
    dist.all_reduce(total)
    return total


def test_one_table_with_a_pass_a_failure_and_the_total():
    namespace = {"gather_all": gather_all, "sum_to_rank0": sum_to_rank0, "torch": torch,
                 "dist": dist}
    lines = []
    rows = check_all(namespace, "00_launch", out=lines.append)
    points = {g.exercise: g.points for g in grader_cells(read("exercises/00_launch.ipynb"))}
    assert [r[0] for r in rows] == list(points)
    by_name = {r[0]: r for r in rows}
    assert by_name["gather_all"][1:3] == (points["gather_all"],) * 2
    assert by_name["gather_all"][3] == "passed"
    assert by_name["sum_to_rank0"][1] == 0
    assert "called dist.all_reduce, which this exercise does not allow" in by_name["sum_to_rank0"][3]
    assert lines[0].splitlines()[-1].split()[:4] == ["total", str(points["gather_all"]), "/",
                                                    str(sum(points.values()))]


def test_a_function_not_run_yet_is_named():
    rows = check_all({}, "00_launch", out=lambda text: None)
    assert all(r[1] == 0 and "is not defined: run the cell that defines it first" in r[3]
               for r in rows)


def test_long_failures_are_cut_to_the_width():
    text = format_rows([("x", 0, 2, "word " * 60)], width=60)
    assert all(len(line) <= 60 for line in text.splitlines())


def test_a_notebook_that_is_not_there_is_said_not_raised():
    lines = []
    assert check_all({}, "99_nothing", out=lines.append) == []
    assert "no exercise notebook" in lines[0] and "99_nothing.ipynb" in lines[0]


def test_a_grader_passed_in_its_cell_is_not_run_again_and_a_new_definition_is():
    """After Run All each grader has just passed with the same function: the table says so
    without running the check again. A function defined again (even with the same code) is a
    new object, so it is checked afresh, and a wrong one fails. (Lesson 08's merge: a check in
    this process, so the test runs no ranks.)"""
    from dlcourse.checks.context import check_merge_partials
    from dlcourse.checks.summary import PASSED_IN_ITS_CELL
    from test_checks_context_merge import merge_partials, merge_without_the_max

    def first(*args):  # the student's merge_partials, as its grader cell saw it
        return merge_partials(*args)

    def again(*args):  # the same body, defined again: another object
        return merge_partials(*args)

    check_merge_partials(first)  # the grader cell
    namespace = {"merge_partials": first}
    rows = {r[0]: r for r in check_all(namespace, "08_context_parallel", out=lambda t: None)}
    assert rows["merge_partials"][3] == PASSED_IN_ITS_CELL
    for answer, says in ((again, "passed"), (merge_without_the_max, "one softmax over all")):
        namespace["merge_partials"] = answer
        rows = {r[0]: r for r in check_all(namespace, "08_context_parallel", out=lambda t: None)}
        assert says in rows["merge_partials"][3], rows["merge_partials"]
