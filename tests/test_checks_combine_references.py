"""Lesson 07's checks' references agree with the lesson's own code (RankGrid, combine), and the
library is refused however a determined student reaches it."""

import itertools
import math

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine.axis_groups import reference_groups
from dlcourse.checks.combine.grids import reference_coords
from dlcourse.checks.combine.step_collectives import reference_collectives
from dlcourse.checks.combine import (check_cost_per_million_tokens, check_grid_state_bytes,
                                     check_rank_coords)
from dlcourse.memory import model_state_bytes
from dlcourse.parallel.grid import RankGrid
from dlcourse.planner.estimate import estimate
from test_checks_cost_per_million_tokens import cost


# --- the references themselves ---------------------------------------------------------------

def test_the_grid_reference_agrees_with_the_lessons_rank_grid():
    """The check's enumeration (itertools.product) and lesson 07's RankGrid (divmod) are written
    independently; they must agree on every grid of up to 16 ranks and every order."""
    for sizes in itertools.product((1, 2, 3, 4), repeat=3):
        sizes = dict(zip(("pp", "dp", "tp"), sizes))
        if math.prod(sizes.values()) > 16:
            continue
        for order in itertools.permutations(("pp", "dp", "tp")):
            grid = RankGrid(**sizes, order=order)
            coords = reference_coords(sizes, order)
            assert coords == [grid.coords(r) for r in range(grid.world_size)]
            for axis in ("pp", "dp", "tp"):
                assert reference_groups(sizes, order, axis) == \
                    sorted(grid.axis_groups(axis))


# The step_collectives reference against what lesson 07's combine() issues, counted at torch's
# dispatcher (lesson 02's CommCounter) on 6 ranks: the two axes of each grid have different
# sizes (2 and 3), so a collective's group size says which axis it ran on.
MEASURED = {  # name: (dp, tp, pp, zero_stage, sequence_parallel, micro_batches)
    "DP x TP": (3, 2, 1, 0, False, 1), "ZeRO-1 x TP": (3, 2, 1, 1, False, 1),
    "ZeRO-3 x TP": (3, 2, 1, 3, False, 1), "ZeRO-2 x TP, SP": (3, 2, 1, 2, True, 1),
    "DP x PP": (2, 1, 3, 0, False, 3), "TP x PP": (1, 2, 3, 0, False, 3),
}


def _collectives_per_axis(plans):
    """On every rank: {name: {axis: set of ops}} of one training step of each plan."""
    from dlcourse.collectives import CommCounter
    from dlcourse.models import GPT, GPTConfig, synthetic_tokens
    from dlcourse.parallel.combine import GridPlan, combine
    config = GPTConfig(vocab_size=16, seq_len=4, n_layers=3, n_heads=2, hidden=8)
    x, y = synthetic_tokens(6, config, seed=1)
    out = {}
    for name, (dp, tp, pp, zero, sp, m) in plans.items():
        plan = GridPlan(RankGrid(dp=dp, tp=tp, pp=pp), zero_stage=zero, micro_batches=m,
                        sequence_parallel=sp, schedule="1F1B")
        trainer = combine(GPT(config, seed=0), plan, plan.grid.new_groups())
        with CommCounter() as comm:
            trainer.train_step(x, y)
        axis_of = {size: axis for axis, size in (("dp", dp), ("tp", tp), ("pp", pp)) if size > 1}
        out[name] = {axis: {r.op for r in comm.records if axis_of.get(r.group_size) == axis}
                     for axis in ("pp", "dp", "tp")}
    return out


def test_the_collectives_reference_is_what_combine_issues():
    import dlcourse
    per_rank = dlcourse.launch(_collectives_per_axis, MEASURED, world_size=6, timeout=120)
    for name, (dp, tp, pp, zero, sp, _) in MEASURED.items():
        measured = {axis: set().union(*(r[name][axis] for r in per_rank))
                    for axis in ("pp", "dp", "tp")}  # what the axis's groups ran, all ranks
        assert measured == reference_collectives(dp, tp, pp, zero, sp), name


# --- issue 17: the determined student --------------------------------------------------------

def coords_default_argument(rank, sizes, order, _coords=RankGrid.coords):  # captured early
    return _coords(RankGrid(**sizes, order=order), rank)


def _copy(fn):
    import types
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)


_state_copy = _copy(model_state_bytes)  # a copy made before the check: another function object


def state_bytes_copied(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return _state_copy(n_params / (tp * pp), dp=dp, zero_stage=zero_stage).total


def cost_from_another_module(*args):
    from dlcourse import planner  # the package's own name for it
    return planner.estimate.estimate(None, None, None)


@pytest.mark.parametrize("check, answer, refused", [
    (check_rank_coords, coords_default_argument, "RankGrid"),
    (check_grid_state_bytes, state_bytes_copied, "model_state_bytes"),
    (check_cost_per_million_tokens, cost_from_another_module, "estimate"),
])
def test_the_library_is_refused_however_it_is_reached(check, answer, refused):
    first, _ = first_line_and_hint(check, answer)
    assert refused in first and "which this exercise does not allow" in first, first


def test_a_table_of_one_runs_answers_fails_the_next_run():
    """Answers copied from one run (its seed) do not pass another: the cases are drawn afresh."""
    seen = {}

    def recording(*args):
        seen[repr(args)] = cost(*args)
        return seen[repr(args)]

    check_cost_per_million_tokens(recording, seed=1)

    def table(*args):
        return seen.get(repr(args), 0.0)

    check_cost_per_million_tokens(table, seed=1)  # the same cases: the table knows them
    first, _ = first_line_and_hint(check_cost_per_million_tokens, table, seed=2)
    assert "expected $" in first, first
