"""The tour's pipeline rows (lesson 06): GPipe, 1F1B, interleaved 1F1B and ZB-H1 from scratch,
and torch.distributed.pipelining's Schedule1F1B on the same stages.

The tour's GPT has cfg.model.n_layers blocks (2 by default), and a stage needs at least one:
so the rows run pp = the most stages that fit (2 of the default GPT's blocks; 4 ranks: 2
pipelines of 2 stages, each on half the global batch, their gradients averaged as in lesson 03
over the data-parallel group of `RankGrid(dp, pp)`). Interleaved 1F1B needs pp x v blocks: with
the default 2-block GPT it would fit only pp = 1, so its row asks for n_layers >= 4.
"""

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.collectives import CommCounter
from dlcourse.memory import peak_activations
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.pipeline import (SCHEDULES, cut_stages, gather_params, split_micro_batches,
                                        train_step)
from dlcourse.parallel.pipeline.torch_api import torch_schedule, torch_train_step
from dlcourse.tour.common import RowResult, held_bytes, mean_loss

N_MICRO = 4  # micro-batches per step on each pipeline
TORCH = "torch Schedule1F1B"


def pipeline_grid(cfg, v=1):
    """RankGrid(dp, pp): pp the most stages (at most 4) that divide the world and fit pp x v
    stages into the model's blocks; the rest of the ranks replicate the pipeline."""
    world = dist.get_world_size()
    fits = [pp for pp in (4, 2, 1) if world % pp == 0 and pp * v <= cfg.model.n_layers]
    if v > 1 and fits[0] == 1:
        raise ValueError(f"interleaved 1F1B with v={v} needs at least 2 x {v} = {2 * v} blocks "
                         f"for 2 stages per rank group; the tour's GPT has n_layers="
                         f"{cfg.model.n_layers}: give TourConfig a GPTConfig with more layers")
    return RankGrid(dp=world // fits[0], pp=fits[0])


def train_pp_row(schedule, cfg, v=1):
    """cfg.steps AdamW steps of the course GPT in a pipeline run by `schedule` (a name of
    SCHEDULES, or TORCH), on every rank. The first step is counted (CommCounter) and not timed."""
    if cfg.cuda:
        raise ValueError("the pipeline rows run on gloo (CPU): run the tour with backend gloo")
    groups = pipeline_grid(cfg, v).new_groups()
    stages = cut_stages(cfg.new_model(), groups.pp, v)
    optimizer = torch.optim.AdamW([p for s in stages for p in s.parameters()], lr=cfg.lr)
    x, y = shard_batch(cfg.data(), groups.dp)  # each pipeline replica gets its slice
    step = _step_fn(schedule, stages, optimizer, x, y, groups, v)
    with CommCounter() as comm:  # the first step counted: bytes sent, activations held
        loss, activations = peak_activations(nn.ModuleList(stages), step, ignore=(x, y))
    times = []
    for _ in range(cfg.steps - 1):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    sent = sum(r.bus_bytes() for r in comm.records if r.op != "recv")  # what it put on its links
    return RowResult(mean_loss(loss, cfg), gather_params(stages, groups.pp),
                     held_bytes(nn.ModuleList(stages), optimizer), round(sent),
                     statistics.median(times) if times else float("nan"), activations)


def _step_fn(schedule, stages, optimizer, x, y, groups, v):
    if schedule == TORCH:
        torch_steps = torch_schedule("1F1B", stages, N_MICRO, groups.pp)
        return lambda: torch_train_step(torch_steps, stages, optimizer, x, y, groups.pp, groups.dp)
    micro = split_micro_batches(x, y, N_MICRO)
    return lambda: train_step(stages, optimizer, SCHEDULES[schedule], micro, groups.pp, v=v,
                              dp_group=groups.dp)
