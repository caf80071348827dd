"""Issue 28: a correct answer passes whatever plain numeric type it returns (a Fraction, numpy
integers and arrays, the tuple `np.unravel_index` gives), in the notebook and when `dlcourse
grade` runs it on a rank whose answer is read as data only (`dlcourse/returned.py`); what is
not data is still refused, by name."""

import fractions

import numpy as np
import pytest

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.combine import check_rank_coords
from dlcourse.checks.core import Submitted
from dlcourse.checks.pipeline import check_bubble_fraction, check_stage_boundaries
from dlcourse.returned import as_data


def graded(fn):
    """`fn` as `dlcourse grade` hands it to a check: the kernel's pickle, run on ranks."""
    return Submitted(fn.__name__, pickling.dumps(fn))


AS_GIVEN, AS_GRADED = (lambda fn: fn), graded


def bubble_fraction(n_stages, n_micro):  # exact: (p - 1) / (m + p - 1) as a Fraction
    return fractions.Fraction(n_stages - 1, n_micro + n_stages - 1)


def stage_boundaries(n_layers, n_stages):  # numpy's running sum: an array of numpy integers
    sizes = np.full(n_stages, n_layers // n_stages)
    sizes[: n_layers % n_stages] += 1
    return np.concatenate([[0], np.cumsum(sizes)])


def stage_boundaries_tuple(n_layers, n_stages):  # a tuple of numpy integers
    return tuple(stage_boundaries(n_layers, n_stages))


def rank_coords(rank, sizes, order):  # numpy's unravel_index: a tuple of numpy integers
    return dict(zip(order, np.unravel_index(rank, [sizes[axis] for axis in order])))


@pytest.mark.parametrize("how", [AS_GIVEN, AS_GRADED], ids=["in the notebook", "graded"])
def test_a_fraction_and_numpy_integers_pass_where_numbers_are_asked(how, capsys):
    check_bubble_fraction(how(bubble_fraction))
    check_stage_boundaries(how(stage_boundaries))
    check_stage_boundaries(how(stage_boundaries_tuple))
    assert capsys.readouterr().out.count("passed on") == 3


def test_coordinates_from_numpy_unravel_index_pass_when_graded(capsys):
    check_rank_coords(graded(rank_coords))  # ~60 cases in one launch (call_each_in_process)
    assert "rank_coords: passed" in capsys.readouterr().out


def coords_that_raise_past_two_by_two(rank, sizes, order):  # wrong, then raising, case by case
    if rank >= 4:
        raise IndexError(f"rank {rank} is past my 2 x 2 table")
    return dict(zip(order, np.unravel_index(rank, [sizes[axis] for axis in order])))


def coords_first_axis_fastest(rank, sizes, order):
    return dict(zip(order, reversed(np.unravel_index(rank, [sizes[a] for a in reversed(order)]))))


@pytest.mark.parametrize("answer", [coords_that_raise_past_two_by_two, coords_first_axis_fastest])
def test_a_graded_batch_fails_at_the_case_the_notebook_fails_at(answer):
    """call_each_in_process runs every case on one rank; the failure it reports is the first
    one the notebook's case-by-case calls meet, with the same name and hint (seed fixed)."""
    in_notebook = first_line_and_hint(check_rank_coords, answer, seed=3)
    assert first_line_and_hint(check_rank_coords, graded(answer), seed=3) == in_notebook
    assert in_notebook[0].startswith("rank_coords(") and in_notebook[1]


class Half:
    """A number by its own account (`float()` works), but not data: it could run code."""

    def __float__(self):
        return 0.5


def bubble_as_an_object(n_stages, n_micro):
    return Half()


def test_what_is_not_data_is_still_refused_by_name_when_graded():
    first, _ = first_line_and_hint(check_bubble_fraction, graded(bubble_as_an_object))
    assert "returned a test_checks_plain_types.Half, but this launch reads only data" in first


def test_as_data_turns_plain_types_into_python_s_and_leaves_the_rest():
    half = Half()
    value = {"f": fractions.Fraction(1, 4), "i": np.int64(3), "a": np.arange(3).reshape(1, 3),
             "t": np.unravel_index(5, (2, 3)), "s": frozenset({np.int8(1)}), "o": half}
    assert as_data(value) == {"f": 0.25, "i": 3, "a": [[0, 1, 2]], "t": (1, 2), "s": {1},
                              "o": half}
    assert [type(as_data(value)[k]) for k in "fit"] == [float, int, tuple]
    assert type(as_data(value)["t"][0]) is int and type(as_data(value)["s"]) is set
