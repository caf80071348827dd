"""The tour's pipeline rows (lesson 06): GPipe, 1F1B, interleaved 1F1B and ZB-H1 from scratch,
and torch.distributed.pipelining's Schedule1F1B on the same stages.

The tour's GPT has cfg.model.n_layers blocks (2 by default), and a stage needs at least one:
so the rows run pp = the most stages that fit (2 of the default GPT's blocks; 4 ranks: 2
pipelines of 2 stages, each on half the global batch, their gradients averaged as in lesson 03
over the data-parallel group of `RankGrid(dp, pp)`). Interleaved 1F1B needs pp x v blocks: its
row (`train_interleaved_row`) trains the same GPT made deep enough for v = 2 chunks on every
rank (8 blocks at 4 ranks) and brings that GPT's one-process run as its reference.
"""

import dataclasses

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
from dlcourse.tour.common import RowResult, held_bytes, mean_loss, train_reference

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


def deep_enough(cfg, v=2):
    """cfg with a GPT of v x 2 blocks (or its own, if deeper): 2 stages per pipeline, each rank
    holding v chunks of one block, the other ranks data-parallel copies as in the other rows.
    (pp = 4 would need 8 blocks; AdamW then carries the fp32 rounding of the deeper model past
    the tour's tolerance: 1.2e-5 measured at 3 steps.)"""
    n_layers = max(cfg.model.n_layers, v * 2)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=n_layers))


def train_interleaved_row(cfg, v=2):
    """Interleaved 1F1B with v chunks per rank on `deep_enough(cfg)`'s GPT; rank 0 also
    runs that GPT in one process (the tour's reference is a shallower GPT) for the comparison."""
    deep = deep_enough(cfg, v)
    result = train_pp_row("interleaved 1F1B", deep, v)
    if dist.get_rank() == 0:  # the row's result is rank 0's
        result.reference = train_reference(deep).params
    return result


def _step_fn(schedule, stages, optimizer, x, y, groups, v):
    if schedule == TORCH:
        torch_steps = torch_schedule("1F1B", stages, N_MICRO, groups.pp)
        return lambda: torch_train_step(torch_steps, stages, optimizer, x, y, groups.pp, groups.dp)
    micro = split_micro_batches(x, y, N_MICRO)
    return lambda: train_step(stages, optimizer, SCHEDULES[schedule], micro, groups.pp, v=v,
                              dp_group=groups.dp)
