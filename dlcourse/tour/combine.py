"""The tour's combined rows (lesson 07): the course GPT on a rank grid, each axis one strategy,
with `dlcourse.parallel.combine` (lesson 03's DP or lesson 05's ZeRO on dp, lesson 04's TP on tp,
lesson 06's pipeline on pp, lesson 08's context parallelism on cp). Each plan needs its own
number of ranks: 4 for the 2-D grids, 8 for dp x tp x pp; at another world size the tour says
so and leaves the row out."""

import statistics
import time

import torch
import torch.nn as nn

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import peak_activations, storage_bytes
from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.zero.measure import held_bytes
from dlcourse.tour.common import RowResult, mean_loss

PLANS = {  # row name -> the plan; micro-batches only where a pipeline needs them
    "DP x TP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2)),
    "DP x PP (lesson 07)": GridPlan(RankGrid(dp=2, pp=2), micro_batches=2),
    "TP x PP (lesson 07)": GridPlan(RankGrid(tp=2, pp=2), micro_batches=2),
    "ZeRO-3 x TP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2), zero_stage=3),
    "DP x TP x PP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2, pp=2), micro_batches=2),
    "DP x CP (lessons 07-08)": GridPlan(RankGrid(dp=2, cp=2)),  # the zig-zag ring on cp
}


def check_grid_row(name, cfg, world_size):
    """Before any rank starts: the grid's size is the job's, and the model fits it."""
    plan = PLANS[name]
    plan.grid.check_world_size(world_size)
    plan.check(cfg.model, cfg.global_batch)


def train_grid_row(name, cfg):
    """cfg.steps AdamW steps of the course GPT on `name`'s grid; one more step on a fresh copy
    is counted apart (bytes moved, activations held), so that counting does not slow the timed
    steps."""
    plan = PLANS[name]
    groups = plan.grid.new_groups()
    trainer = combine(cfg.new_model(), plan, groups, lr=cfg.lr)
    x, y = cfg.data()
    times, loss = [], None
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = trainer.train_step(x, y)
        times.append(time.perf_counter() - start)
    state = _held_bytes(trainer)
    params = {k: v.to("cpu") for k, v in trainer.full_parameters().items()}
    fresh = combine(cfg.new_model(), plan, groups, lr=cfg.lr)
    with CommCounter() as comm:
        _, activations = peak_activations(nn.ModuleList(fresh.modules),
                                          lambda: fresh.train_step(x, y), ignore=(x, y))
    return RowResult(mean_loss(loss, cfg), params, state, round(comm.bus_bytes()),
                     statistics.median(times), activations)


def _held_bytes(trainer):
    """Bytes of this rank's parameters, gradients and optimizer state (lesson 05's count, which
    knows ZeRO's shards; a pipeline rank's stages summed)."""
    if len(trainer.modules) == 1:
        return held_bytes(trainer.modules[0], trainer.optimizer).model_state
    params = [p for m in trainer.modules for p in m.parameters()]
    tensors = params + [p.grad for p in params if p.grad is not None]
    tensors += [t for s in trainer.optimizer.state.values() for t in s.values()
                if torch.is_tensor(t)]
    return storage_bytes(tensors)
