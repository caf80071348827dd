"""The same pipeline with torch.distributed.pipelining (lesson 06, `lessons/06_pipeline.ipynb`).

torch's `PipelineStage` wraps a stage module we cut ourselves (the "manual split"); a schedule
class runs the stages of every rank, micro-batches and all:

    stages = cut_stages(gpt, group, v)                   # our stages, unchanged
    schedule = torch_schedule("1F1B", stages, n_micro, group)
    loss = torch_train_step(schedule, stages, optimizer, x, y, group)

torch's `pipeline()` instead traces the whole model and cuts it at named layers
(`traced_stage`). Its loss is `lm_loss` of each micro-batch with the gradients divided by m
(`scale_grads=True`): the same mean over micro-batches as our executor. torch knows nothing
of the tied embedding, so `sync_tied_grads` runs after its step as after ours
(`executor.finish_gradients`).
"""

import torch
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV,
                                          ScheduleGPipe, ScheduleInterleaved1F1B,
                                          ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
                                          SplitPoint, pipeline)

from dlcourse.collectives.p2p import rank_in
from dlcourse.models import lm_loss
from dlcourse.parallel.pipeline.executor import finish_gradients
from dlcourse.parallel.pipeline.stages import stage_boundaries

TORCH_SCHEDULES = {  # our schedule's name -> torch's class; all but the first two take v stages
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "interleaved 1F1B": ScheduleInterleaved1F1B,
    "interleaved zero bubble": ScheduleInterleavedZeroBubble,
    "ZBV": ScheduleZBVZeroBubble,  # v = 2 stages per rank dealt in a V: cut_stages(style="v")
    "DualPipeV": ScheduleDualPipeV,  # the same V
}
V_SHAPED = ("ZBV", "DualPipeV")
AT_LEAST_ONE_PER_STAGE = (Schedule1F1B, ScheduleDualPipeV)  # torch 2.13 refuses m < stages


def torch_schedule(name, stages, n_micro, group=None):
    """torch's schedule `name` over this rank's stages (each wrapped in a PipelineStage)."""
    cls = TORCH_SCHEDULES[name]
    n_stages = stages[0].n_stages
    if cls in AT_LEAST_ONE_PER_STAGE and n_micro < n_stages:
        raise ValueError(f"torch's {cls.__name__} refuses fewer micro-batches than stages: "
                         f"n_micro {n_micro} < {n_stages}; use n_micro >= {n_stages}")
    wrapped = [PipelineStage(s, s.index, s.n_stages, torch.device("cpu"), group=group)
               for s in stages]
    if cls in (ScheduleGPipe, Schedule1F1B):
        return cls(wrapped[0], n_micro, loss_fn=lm_loss)
    return cls(wrapped, n_micro, loss_fn=lm_loss)


def torch_train_step(schedule, stages, optimizer, x, y, group=None, dp_group=None):
    """One optimizer step with torch's schedule: the first stage's rank feeds the whole batch x
    (torch cuts it into micro-batches), the last stage's rank the targets y; then the same
    `finish_gradients` as ours. Returns the mean loss over micro-batches on the last stage's
    rank, None elsewhere."""
    optimizer.zero_grad()
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses = [] if last else None
    schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses)
    finish_gradients(stages, group, dp_group)
    optimizer.step()
    return torch.stack(losses).mean().item() if last else None


def traced_stage(gpt, x_micro, group=None):
    """torch's `pipeline()`: trace `gpt` on one micro-batch of tokens and cut it before the first
    block of each stage (our `stage_boundaries`); returns (this rank's PipelineStage, the traced
    stage module). The tied matrix stays tied inside torch's stages only if both ends are on one."""
    rank, p = rank_in(group, "traced_stage")
    bounds = stage_boundaries(gpt.config.n_layers, p)
    split_spec = {f"blocks.{b}": SplitPoint.BEGINNING for b in bounds[1:-1]}
    pipe = pipeline(gpt, mb_args=(x_micro,), split_spec=split_spec)
    stage = pipe.build_stage(rank, torch.device("cpu"), group=group)
    return stage, pipe.get_stage_module(rank)
