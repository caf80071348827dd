"""The grids lesson 07's grid checks draw (`rank_coords.py`, `axis_groups.py`): 2 to 16 ranks, 1 to
4 per axis, the axes in a random order, the first grid with all three axes above 1 in an order
other than the default; the reference enumeration, itertools.product in the grid's order (C
order, the last axis fastest), not divmod; and an answer read as {axis: value}.
"""

import itertools
import math
from collections.abc import Mapping

from dlcourse.checks.core import fail, kind


AXES = ("pp", "dp", "tp")
CASES = 6


def draw_grid(rng, max_ranks=16, axes_above_1=None):
    """({"pp", "dp", "tp"}: sizes, order): 2 to 16 ranks, at least `axes_above_1` axes of size
    above 1 (drawn if None: mostly two), the order a random permutation of the axes (with all
    three above 1, never the default one)."""
    least = rng.choice((1, 2, 2)) if axes_above_1 is None else axes_above_1
    while True:
        sizes = {axis: rng.choice((1, 1, 2, 2, 3, 4)) for axis in AXES}
        order = tuple(rng.sample(AXES, 3))
        above = sum(s > 1 for s in sizes.values())
        if (2 <= math.prod(sizes.values()) <= max_ranks and above >= least
                and not (axes_above_1 == 3 and order == AXES)):
            return sizes, order


def draw_grids(rng):
    """CASES grids, the first with all three axes above 1 in an order that is not the default."""
    return [draw_grid(rng, axes_above_1=3)] + [draw_grid(rng) for _ in range(CASES - 1)]


def reference_coords(sizes, order):
    """[{axis: coordinate} for each rank]: the grid enumerated in C order (last axis fastest)."""
    ranges = [range(sizes[axis]) for axis in order]
    return [dict(zip(order, point)) for point in itertools.product(*ranges)]


def describe_grid(sizes, order):
    shape = " x ".join(f"{axis} {sizes[axis]}" for axis in order)
    return f"grid {shape} (order {order}, outermost first)"


def as_axes(got, where, what, hint):
    """got as {axis: value}; fail unless it is a mapping with exactly the three axes."""
    __tracebackhide__ = True
    if not isinstance(got, Mapping) or set(got) != set(AXES):
        keys = sorted(got) if isinstance(got, Mapping) else None
        fail(where, None, f"returned {kind(got)}{f' with keys {keys}' if keys else ''}, expected "
                          f"a dict with the keys 'pp', 'dp' and 'tp', each {what}", hint)
    return {axis: got[axis] for axis in AXES}
