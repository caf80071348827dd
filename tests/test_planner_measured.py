"""The planner's model-state bytes per rank against what lesson 07's grids hold, and the grids'
activation bytes against lesson 07's count (issue 13:
"the planner's memory per rank for the 4- and 8-rank grids of lesson 07 on the course GPT (fp32,
CPU accounting) within 2% of what was measured").

The planner's `memory_per_gpu` assumes bf16 mixed precision and adds activations; CPU training
here is fp32 and the measurement counts model state. So the comparison takes the planner's
parameters on the busiest rank (`stage_params`) and ZeRO's fp32 bytes per parameter
(`model_state_bytes(..., mixed_precision=False)`: 4 + 4 + 8), the two pieces `memory_per_gpu`
builds its model state from.

Tolerance: 2%, the issue's bar. What the formula cannot know is small: ZeRO pads its flat shards
to equal sizes (a few elements) and torch allocates storages as they are (measured: <= 112 B of
~900 kB, 0.01%). Splitting the position table over tp when lesson 04 keeps it whole is 16 kB
(+3.4% on TP x PP): a real mistake this test catches.
"""

import functools

import pytest

import dlcourse
from dlcourse.memory import model_state_bytes
from dlcourse.memory.accounting import count_params
from dlcourse.memory.calculator import ModelSpec, spec_params
from dlcourse.parallel.combine import activation_formula
from dlcourse.planner.estimate import stage_params
from dlcourse.planner.layouts import Layout
from dlcourse.tour.combine import PLANS, check_grid_row, train_grid_row
from dlcourse.tour.common import TourConfig

CFG = TourConfig(steps=1)
TOL = 0.02


def course_spec(c):
    return ModelSpec("course GPT", c.n_layers, c.hidden, c.n_heads, c.vocab_size, c.seq_len,
                     ffn=4 * c.hidden, kv_heads=c.n_heads, gated_mlp=False, bias=c.bias,
                     tied=c.tie_embeddings, learned_positions=True)


def held_by_grid(names):
    rows = {name: train_grid_row(name, CFG) for name in names}
    return {name: (r.state_bytes, r.activation_bytes) for name, r in rows.items()}


@functools.cache
def measured_both(world_size):
    """{grid name: (model-state bytes, activation bytes)}, each of the busiest rank."""
    names = [n for n, p in PLANS.items() if p.grid.world_size == world_size]
    for name in names:
        check_grid_row(name, CFG, world_size)
    per_rank = dlcourse.launch(held_by_grid, names, world_size=world_size, timeout=120)
    return {name: tuple(max(r[name][i] for r in per_rank) for i in range(2)) for name in names}


def measured(world_size):
    return {name: both[0] for name, both in measured_both(world_size).items()}


def test_the_course_gpt_spec_counts_the_models_parameters():
    assert spec_params(course_spec(CFG.model)) == count_params(CFG.model)


@pytest.mark.parametrize("name", list(PLANS))
def test_planner_model_state_per_rank_matches_the_measured_grid(name):
    plan = PLANS[name]
    g = plan.grid
    layout = Layout(g.dp, g.tp, g.pp, zero_stage=plan.zero_stage, cp=g.cp)
    n_params = stage_params(course_spec(CFG.model), layout)
    want = model_state_bytes(n_params, dp=layout.replicas, zero_stage=plan.zero_stage,
                             mixed_precision=False).total  # ZeRO would shard over dp x cp
    got = measured(g.world_size)[name]
    assert abs(got / want - 1) <= TOL, (
        f"{name}: the busiest rank holds {got:,} B, the planner's formula says {want:,.0f} B "
        f"({got / want - 1:+.1%}, more than {TOL:.0%})")


@pytest.mark.parametrize("name", list(PLANS))
def test_grid_activations_of_the_busiest_rank_are_the_lessons_count_to_the_byte(name):
    # Issue 12: lesson 07's activation column. The formula is lessons 01/04's saved tensors of a
    # stage's blocks and ends on one micro-batch, times what lesson 06's schedule holds at once;
    # the measurement is lesson 01's SavedTensorLog over one real step on the grid (ZeRO-3's
    # gathered weights are parameters, not activations). No tolerance: both count bytes.
    plan = PLANS[name]
    want = activation_formula(CFG.model, plan, CFG.global_batch)
    got = measured_both(plan.grid.world_size)[name][1]
    assert got == want, f"{name}: measured {got:,} B of activations, the count says {want:,} B"
