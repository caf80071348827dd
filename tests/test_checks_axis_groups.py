"""Lesson 07's check of axis_groups (`dlcourse/checks/combine/axis_groups.py`): the solutions and
correct answers written other ways pass; the wrong answers students write fail with a message
naming the case, the rank and a hint that says which mistake it was. Every run draws new cases,
so each wrong answer here fails on whatever is drawn."""

import math

import pytest
import torch

from checking import first_line_and_hint
from dlcourse.checks.combine import check_axis_groups
from dlcourse.parallel.grid import RankGrid
from test_checks_rank_coords import coords_divmod


# --- exercise 2: axis_groups -----------------------------------------------------------------

def groups_by_other_coords(sizes, order, axis):
    found = {}
    for rank in range(math.prod(sizes.values())):
        c = coords_divmod(rank, sizes, order)
        found.setdefault(tuple(c[a] for a in order if a != axis), []).append(rank)
    return list(found.values())


def groups_by_transpose(sizes, order, axis):  # move the axis last, read the rows
    grid = torch.arange(math.prod(sizes.values())).reshape([sizes[a] for a in order])
    rows = grid.movedim(order.index(axis), -1).reshape(-1, sizes[axis])
    return [sorted(row.tolist(), reverse=True) for row in reversed(rows)]  # any order passes


def groups_consecutive(sizes, order, axis):  # right for the innermost axis only: mixes axes
    n = math.prod(sizes.values())
    return [list(range(i, i + sizes[axis])) for i in range(0, n, sizes[axis])]


def groups_strided_by_size(sizes, order, axis):  # ranks sizes[axis] apart: mixes axes too
    n, k = math.prod(sizes.values()), sizes[axis]
    return [list(range(i, n, n // k)) for i in range(n // k)]


def groups_reversed_order(sizes, order, axis):
    return groups_by_other_coords(sizes, tuple(reversed(order)), axis)


def groups_from_rank_grid(sizes, order, axis):
    return RankGrid(**sizes, order=order).axis_groups(axis)


@pytest.mark.parametrize("answer", [groups_by_other_coords, groups_by_transpose])
def test_axis_groups_passes_correct_answers(answer, capsys):
    check_axis_groups(answer)
    assert "axis_groups: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [groups_consecutive, groups_strided_by_size,
                                    groups_reversed_order])
def test_axis_groups_fails_groups_that_mix_axes(answer):
    first, hint = first_line_and_hint(check_axis_groups, answer)
    assert first.startswith("axis_groups(") and "expected the" in first, first
    assert "other axis fixed" in hint or "holds sizes" in hint or "a group of" in hint, hint


def test_axis_groups_refuses_the_rank_grid():
    first, _ = first_line_and_hint(check_axis_groups, groups_from_rank_grid)
    assert "RankGrid" in first and "does not allow" in first, first
