"""Lesson 07, exercise 2 (`exercises/07_combining.ipynb`): `check_axis_groups`, every group of
one axis (the ranks whose coordinates differ only on it), against groups read off the grid's
enumeration (`reference_groups`).
"""

import numbers

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.combine.grids import AXES, CASES, describe_grid, draw_grids, reference_coords
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind


GROUPS_HINT = ("a group of `axis` is the ranks whose coordinates are equal on the two other "
               "axes: one group for every combination of those, each with sizes[axis] ranks")


@fresh_cases
def check_axis_groups(axis_groups, *, rng):
    """axis_groups(sizes, order, axis) must return every group of `axis`: lists of ranks that
    agree on the other two axes; together the groups hold each rank once."""
    __tracebackhide__ = True
    expect_callable(axis_groups, "axis_groups")
    for sizes, order in draw_grids(rng):
        for axis in AXES:
            _check_groups_case(axis_groups, sizes, order, axis)
    print(f"axis_groups: passed on {CASES} grids of 2 to 16 ranks in random axis orders, the "
          "groups of every axis")


def reference_groups(sizes, order, axis):
    """The groups of `axis`: ranks collected by their coordinates on the other axes."""
    groups = {}
    for rank, coords in enumerate(reference_coords(sizes, order)):
        others = tuple(coords[a] for a in AXES if a != axis)
        groups.setdefault(others, []).append(rank)
    return sorted(groups.values())


def _check_groups_case(axis_groups, sizes, order, axis):
    __tracebackhide__ = True
    where = f"axis_groups({sizes}, {order}, {axis!r})"
    got = call_in_process(axis_groups, (dict(sizes), order, axis), exercise="axis_groups",
                          where=where, guard=ANSWERS.in_process, hint=GROUPS_HINT)
    want = reference_groups(sizes, order, axis)
    groups = _as_groups(got, where)
    if sorted(groups) == want:
        return
    coords = reference_coords(sizes, order)
    for group in groups:
        mixed = [a for a in AXES if a != axis and len({coords[r][a] for r in group
                                                      if 0 <= r < len(coords)}) > 1]
        if mixed or len(group) != sizes[axis]:
            fail(where, None, f"returned the group {group}, expected the {len(want)} groups "
                              f"{want} of the {describe_grid(sizes, order)}",
                 _groups_hint(group, axis, mixed, sizes, coords))
    fail(where, None, f"returned {groups}, expected the {len(want)} groups {want} of the "
                      f"{describe_grid(sizes, order)}", GROUPS_HINT)


def _as_groups(got, where):
    """got as a list of sorted lists of whole numbers."""
    __tracebackhide__ = True
    hint = "return a list of groups, each a list of global ranks, e.g. [[0, 2], [1, 3]]"
    if not isinstance(got, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in got):
        fail(where, None, f"returned {kind(got)}, expected a list of lists of ranks", hint)
    if not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for g in got for r in g):
        fail(where, None, "returned groups holding something other than whole-number ranks", hint)
    return [sorted(int(r) for r in g) for g in got]


def _groups_hint(group, axis, mixed, sizes, coords):
    if len(group) != sizes[axis]:
        return f"a group of {axis!r} holds sizes[{axis!r}] = {sizes[axis]} ranks. " + GROUPS_HINT
    a = mixed[0]
    seen = sorted({coords[r][a] for r in group if 0 <= r < len(coords)})
    return (f"its ranks sit at {a} coordinates {seen}: a group of {axis!r} must keep every "
            f"other axis fixed, or its collectives would mix ranks that hold different {a} "
            "pieces. Consecutive ranks form a group only for the innermost axis")
