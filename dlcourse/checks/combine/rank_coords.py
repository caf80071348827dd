"""Lesson 07, exercise 1 (`exercises/07_combining.ipynb`): `check_rank_coords`, a rank's
{"pp", "dp", "tp"} coordinates in a grid laid out in any order, against the grid enumerated in
that order (`grids.reference_coords`).
"""

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.combine.grids import (AXES, CASES, as_axes, describe_grid, draw_grids,
                                           reference_coords)
from dlcourse.checks.core import call_each_in_process, expect_callable, fail, fresh_cases


COORDS_HINT = ("the last axis of `order` varies fastest: rank = ((c0 * n1) + c1) * n2 + c2 for "
               "the order's axes 0, 1, 2; undo it from the innermost axis out with divmod")


@fresh_cases
def check_rank_coords(rank_coords, *, rng):
    """rank_coords(rank, sizes, order) must return {"pp": .., "dp": .., "tp": ..}, the rank's
    place in a grid whose axes are laid out in `order`, outermost first."""
    __tracebackhide__ = True
    expect_callable(rank_coords, "rank_coords")
    cases = [(rank, sizes, order, want) for sizes, order in draw_grids(rng)
             for rank, want in enumerate(reference_coords(sizes, order))]
    calls = [((rank, dict(sizes), order), f"rank_coords({rank}, {sizes}, {order})")
             for rank, sizes, order, _ in cases]
    # every rank of every grid in one call: graded, one launch instead of about 60
    answers = call_each_in_process(rank_coords, calls, exercise="rank_coords",
                                   guard=ANSWERS.in_process, hint=COORDS_HINT)
    for (rank, sizes, order, want), (_, where), got in zip(cases, calls, answers):
        got = as_axes(got, where, "a whole-number coordinate", COORDS_HINT)
        if got != want:
            fail(where, None, f"returned {got}, expected {want} in the "
                              f"{describe_grid(sizes, order)}",
                 _coords_hint(got, rank, sizes, order))
    print(f"rank_coords: passed on {CASES} grids of 2 to 16 ranks in random axis orders, every "
          "rank of each")


def _coords_hint(got, rank, sizes, order):
    """Name the mistake that gives `got`, if it is one we know."""
    if got == reference_coords(sizes, tuple(reversed(order)))[rank]:
        return ("that is the grid read with the first axis of `order` varying fastest: `order` "
                f"is outermost first, so {order[-1]!r} is the axis whose neighbours are "
                "consecutive ranks")
    if got == reference_coords(sizes, AXES)[rank] and tuple(order) != AXES:
        return (f"that is the default order {AXES}; this grid is laid out in {order}, use the "
                "order you are given")
    return COORDS_HINT
