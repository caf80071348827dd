"""Lesson 07's grid and collectives checks (the set's guide is `__init__.py`)."""

import itertools
import math
import numbers
from collections.abc import Mapping

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.core import (call_each_in_process, call_in_process, expect_callable, fail,
                                  fresh_cases, kind)


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


# ---------------------------------------------------------------- exercise 1: coordinates

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
        got = _as_axes(got, where, "a whole-number coordinate", COORDS_HINT)
        if got != want:
            fail(where, None, f"returned {got}, expected {want} in the "
                              f"{describe_grid(sizes, order)}",
                 _coords_hint(got, rank, sizes, order))
    print(f"rank_coords: passed on {CASES} grids of 2 to 16 ranks in random axis orders, every "
          "rank of each")


def _as_axes(got, where, what, hint):
    """got as {axis: value}; fail unless it is a mapping with exactly the three axes."""
    __tracebackhide__ = True
    if not isinstance(got, Mapping) or set(got) != set(AXES):
        keys = sorted(got) if isinstance(got, Mapping) else None
        fail(where, None, f"returned {kind(got)}{f' with keys {keys}' if keys else ''}, expected "
                          f"a dict with the keys 'pp', 'dp' and 'tp', each {what}", hint)
    return {axis: got[axis] for axis in AXES}


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


# ---------------------------------------------------------------- exercise 2: axis groups

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


# ---------------------------------------------------------------- exercise 3: collectives

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send", "recv")
COLLECTIVES_HINT = ("an axis of size 1 is a group of one rank: nothing to exchange. Otherwise: "
                    "pp sends and receives, dp all-reduces gradients (ZeRO: reduce-scatter and "
                    "all-gather), tp all-reduces (sequence parallel adds all-gather and "
                    "reduce-scatter, and a pipeline's last stage all-gathers the logits)")


def reference_collectives(dp, tp, pp, zero_stage, sequence_parallel):
    """{axis: set of op names} one training step of lesson 07's `combine` issues."""
    ops = {"pp": set(), "dp": set(), "tp": set()}
    if pp > 1:
        ops["pp"] = {"send", "recv"}  # activations forward, gradients back (and tied grads)
    if dp > 1:
        ops["dp"] = {"reduce_scatter", "all_gather"} if zero_stage else {"all_reduce"}
    if tp > 1:
        ops["tp"] = {"all_reduce"}  # Megatron's f and g, the vocabulary-parallel embedding/loss
        if sequence_parallel:
            ops["tp"] |= {"all_gather", "reduce_scatter"}  # g and g-bar of sequence parallelism
        if pp > 1:
            ops["tp"] |= {"all_gather"}  # the last stage gathers whole logits for the loss
    return ops


def draw_plan(rng):
    """(dp, tp, pp, zero_stage, sequence_parallel) that lesson 07's GridPlan accepts."""
    sizes, _ = draw_grid(rng)
    dp, tp, pp = sizes["dp"], sizes["tp"], sizes["pp"]
    zero = rng.choice((0, 1, 2, 3)) if pp == 1 else 0  # ZeRO with pp > 1 is not built
    sp = rng.random() < 0.5 if pp == 1 and tp > 1 else False
    return dp, tp, pp, zero, sp


@fresh_cases
def check_step_collectives(step_collectives, *, rng):
    """step_collectives(dp, tp, pp, zero_stage, sequence_parallel) must return {"pp", "dp",
    "tp"}: the set of collective names each axis's group runs in one training step."""
    __tracebackhide__ = True
    expect_callable(step_collectives, "step_collectives")
    fixed = [(2, 2, 1, 1, False), (2, 1, 2, 0, False), (1, 2, 2, 0, False)]  # ZeRO, PP, TP x PP
    drawn = [draw_plan(rng) for _ in range(3 * CASES)]
    for args in fixed + drawn:
        where = ("step_collectives(dp={}, tp={}, pp={}, zero_stage={}, sequence_parallel={})"
                 .format(*args))
        got = call_in_process(step_collectives, args, exercise="step_collectives", where=where,
                              guard=ANSWERS.in_process, hint=COLLECTIVES_HINT)
        got = _as_op_sets(got, where)
        want = reference_collectives(*args)
        for axis in AXES:
            if got[axis] != want[axis]:
                fail(where, None, f"says the {axis} axis runs {_ops(got[axis])}, expected "
                                  f"{_ops(want[axis])}", _collectives_hint(axis, got, want, args))
    print(f"step_collectives: passed on {len(fixed) + len(drawn)} grids (ZeRO stages 0-3, "
          "sequence parallel on and off, axes of size 1)")


def _ops(ops):
    return "{" + ", ".join(sorted(ops)) + "}" if ops else "nothing"


def _as_op_sets(got, where):
    __tracebackhide__ = True
    hint = f"return {{'pp': set(...), 'dp': set(...), 'tp': set(...)}} of names from {OPS}"
    got = _as_axes(got, where, "a set of collective names", hint)
    for axis, ops in got.items():
        if isinstance(ops, str) or not isinstance(ops, (set, frozenset, list, tuple)):
            fail(where, None, f"{axis} is {kind(ops)}, expected a set of names", hint)
        unknown = sorted(set(map(str, ops)) - set(OPS))
        if unknown:
            fail(where, None, f"{axis} names {unknown}, which are not among {OPS}", hint)
    return {axis: set(ops) for axis, ops in got.items()}


def _collectives_hint(axis, got, want, args):
    dp, tp, pp, zero, sp = args
    size = {"dp": dp, "tp": tp, "pp": pp}[axis]
    zero_ops = {"reduce_scatter", "all_gather"}
    if zero and not sp and zero_ops <= got["tp"] and not zero_ops <= got["dp"]:
        return ("ZeRO shards the model state over the data-parallel replicas (dp); the tp ranks "
                "hold different slices of the weights, not copies to shard")
    if size == 1:
        return f"{axis} has size 1 here: its group is one rank, which exchanges nothing"
    if axis == "dp" and zero and "all_reduce" in got["dp"]:
        return ("ZeRO replaces data parallelism's all-reduce by what it is made of: a "
                "reduce-scatter of the gradients, then an all-gather of the updated parameters")
    return COLLECTIVES_HINT
