"""Lesson 07's check of rank_coords (`dlcourse/checks/combine/rank_coords.py`): the solutions and
correct answers written other ways pass; the wrong answers students write fail with a message
naming the case, the rank and a hint that says which mistake it was. Every run draws new cases,
so each wrong answer here fails on whatever is drawn."""

import math

import pytest
import torch

from checking import first_line_and_hint
from dlcourse.checks.combine import check_rank_coords
from dlcourse.parallel.grid import RankGrid


# --- exercise 1: rank_coords -----------------------------------------------------------------


def coords_divmod(rank, sizes, order):
    coords = {}
    for axis in reversed(order):
        rank, coords[axis] = divmod(rank, sizes[axis])
    return coords


def coords_strides(rank, sizes, order):  # strides, as torch's tensors lay out a C-ordered array
    strides = {axis: math.prod(sizes[a] for a in order[i + 1:]) for i, axis in enumerate(order)}
    return {axis: rank // strides[axis] % sizes[axis] for axis in order}


def coords_unravel(rank, sizes, order):  # a tensor of ranks, searched
    grid = torch.arange(math.prod(sizes.values())).reshape([sizes[a] for a in order])
    where = (grid == rank).nonzero()[0].tolist()
    return dict(zip(order, where))


def coords_reversed_order(rank, sizes, order):  # the first axis varies fastest
    return coords_divmod(rank, sizes, tuple(reversed(order)))


def coords_default_order(rank, sizes, order):  # ignores the order it is given
    return coords_divmod(rank, sizes, ("pp", "dp", "tp"))


def coords_fixed_shape(rank, sizes, order):  # right for a 2 x 2 x 2 grid in default order only
    return {"pp": rank // 4, "dp": rank // 2 % 2, "tp": rank % 2}


def coords_tuple(rank, sizes, order):  # (dp, pp, tp), not a dict
    c = coords_divmod(rank, sizes, order)
    return c["dp"], c["pp"], c["tp"]


def coords_from_rank_grid(rank, sizes, order):
    return RankGrid(**sizes, order=order).coords(rank)


GRID = RankGrid(dp=2, tp=2, pp=2)  # made before the check: its methods must refuse


def coords_from_an_instance(rank, sizes, order):  # a method of an instance made earlier
    return GRID.coords(rank)


def coords_device_mesh(rank, sizes, order):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", tuple(sizes[a] for a in order), mesh_dim_names=order)
    return dict(zip(order, mesh.get_coordinate()))


@pytest.mark.parametrize("answer", [coords_divmod, coords_strides, coords_unravel])
def test_rank_coords_passes_correct_answers(answer, capsys):
    check_rank_coords(answer)
    assert "rank_coords: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (coords_reversed_order, "expected", "varying fastest"),
    (coords_default_order, "expected", ""),
    (coords_fixed_shape, "", ""),
    (coords_tuple, "returned a tuple, expected a dict with the keys 'pp'", ""),
])
def test_rank_coords_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_rank_coords, answer)
    assert first.startswith("rank_coords("), first
    assert says in first and hint in got_hint, (first, got_hint)


@pytest.mark.parametrize("answer, refused", [
    (coords_from_rank_grid, "RankGrid"),
    (coords_from_an_instance, "RankGrid.coords"),
    (coords_device_mesh, "init_device_mesh"),
])
def test_rank_coords_refuses_the_library(answer, refused):
    first, _ = first_line_and_hint(check_rank_coords, answer)
    assert refused in first and "which this exercise does not allow" in first, first


def test_a_failure_names_the_seed_that_repeats_it():
    with pytest.raises(AssertionError) as failed:
        check_rank_coords(coords_reversed_order, seed=7)
    assert "check_rank_coords(your_function, seed=7)" in str(failed.value)
    with pytest.raises(AssertionError) as again:
        check_rank_coords(coords_reversed_order, seed=7)
    assert str(again.value) == str(failed.value)
