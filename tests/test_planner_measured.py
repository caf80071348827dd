"""The planner's model-state bytes per rank against what lesson 07's grids hold (issue 13:
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
    return {name: train_grid_row(name, CFG).state_bytes for name in names}


@functools.cache
def measured(world_size):
    names = [n for n, p in PLANS.items() if p.grid.world_size == world_size]
    for name in names:
        check_grid_row(name, CFG, world_size)
    per_rank = dlcourse.launch(held_by_grid, names, world_size=world_size, timeout=120)
    return {name: max(r[name] for r in per_rank) for name in names}  # the busiest rank


def test_the_course_gpt_spec_counts_the_models_parameters():
    assert spec_params(course_spec(CFG.model)) == count_params(CFG.model)


@pytest.mark.parametrize("name", list(PLANS))
def test_planner_model_state_per_rank_matches_the_measured_grid(name):
    plan = PLANS[name]
    g = plan.grid
    n_params = stage_params(course_spec(CFG.model), Layout(g.dp, g.tp, g.pp,
                                                           zero_stage=plan.zero_stage))
    want = model_state_bytes(n_params, dp=g.dp, zero_stage=plan.zero_stage,
                             mixed_precision=False).total
    got = measured(g.world_size)[name]
    assert abs(got / want - 1) <= TOL, (
        f"{name}: the busiest rank holds {got:,} B, the planner's formula says {want:,.0f} B "
        f"({got / want - 1:+.1%}, more than {TOL:.0%})")
