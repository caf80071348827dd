"""Lesson 06's pipelines in the catalogue (`lessons/06_pipeline.ipynb`): GPipe, 1F1B, ZB-H1 and
interleaved 1F1B from scratch, and torch.distributed.pipelining's Schedule1F1B on the same stages.

The tour's GPT has cfg.model.n_layers blocks (2 by default), and a stage needs at least one: so
pp = the most stages that fit (2 of the default GPT's blocks; 4 ranks: 2 pipelines of 2 stages,
each on half the global batch, their gradients averaged as in lesson 03 over the dp group of
`RankGrid(dp, pp)`). Interleaved 1F1B needs pp x v blocks: it trains the same GPT made deep
enough for v = 2 chunks per rank (`deep_enough`) and names that GPT as its reference.
"""

import dataclasses
from functools import partial

import torch

from dlcourse.parallel.data import steps
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.pipeline import SCHEDULES, cut_stages, gather_params, split_micro_batches
from dlcourse.parallel.pipeline import train_step as pipeline_train_step
from dlcourse.parallel.pipeline.torch_api import torch_schedule, torch_train_step
from dlcourse.strategies.trainer import Trainer, count_step, rank_of

TORCH = "torch Schedule1F1B"


def pipeline_grid(cfg, world_size, v=1):
    """RankGrid(dp, pp): pp the most stages (at most 4) that divide the world and fit pp x v
    stages into the model's blocks; the rest of the ranks replicate the pipeline."""
    if cfg.cuda:
        raise ValueError("the pipeline rows run on gloo (CPU): run the tour with backend gloo")
    fits = [pp for pp in (4, 2, 1) if world_size % pp == 0 and pp * v <= cfg.model.n_layers]
    if v > 1 and fits[0] == 1:
        raise ValueError(f"interleaved 1F1B with v={v} needs at least 2 x {v} = {2 * v} blocks "
                         f"for 2 stages per rank group; the tour's GPT has n_layers="
                         f"{cfg.model.n_layers}: give TourConfig a GPTConfig with more layers")
    return RankGrid(dp=world_size // fits[0], pp=fits[0])


def build(schedule, cfg, groups, v=1):
    """The pipeline run by `schedule` (TORCH, or a name of lesson 06's SCHEDULES) on this rank's
    v stages, cfg.pipeline_micro_batches per step on each pipeline; its modules are the stages,
    named as the GPT's."""
    stages = cut_stages(cfg.new_model(), groups.pp, v)
    m = cfg.pipeline_micro_batches
    optimizer = torch.optim.AdamW([p for s in stages for p in s.parameters()], lr=cfg.lr)
    if schedule == TORCH:
        torch_steps = torch_schedule("1F1B", stages, m, groups.pp)

    def train_step(x, y):
        x, y = steps.shard_batch((x, y), groups.dp)  # this pipeline's slice
        if schedule == TORCH:
            return torch_train_step(torch_steps, stages, optimizer, x, y, groups.pp, groups.dp)
        return pipeline_train_step(stages, optimizer, SCHEDULES[schedule],
                                   split_micro_batches(x, y, m), groups.pp, v=v,
                                   dp_group=groups.dp)
    # torch's PipelineStage runs each forward once more in step 1 (see TORCH_NOTE)
    return Trainer(stages, optimizer, train_step, partial(gather_params, stages, groups.pp),
                   count=partial(count_step, sent=_sent), dp=rank_of(groups.dp),
                   activations_from=2 if schedule == TORCH else 1)


def _sent(comm):
    """What a stage put on its links: its sends and collectives, not what it received."""
    return sum(r.bus_bytes() for r in comm.records if r.op != "recv")


def deep_enough(cfg, v=2):
    """cfg with a GPT of v x 2 blocks (or its own, if deeper): 2 stages per pipeline, each rank
    holding v chunks of one block, the other ranks data-parallel copies as in the other rows.
    (pp = 4 would need 8 blocks; AdamW then carries the fp32 rounding of the deeper model past
    the tour's tolerance: 1.2e-5 measured at 3 steps.)"""
    n_layers = max(cfg.model.n_layers, v * 2)
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=n_layers))


def build_interleaved(cfg, groups, v=2):
    """Interleaved 1F1B, v chunks per rank, on `deep_enough(cfg)`'s GPT."""
    return build("interleaved 1F1B", deep_enough(cfg, v), groups, v)


def interleaved_grid(cfg, world_size, v=2):
    return pipeline_grid(deep_enough(cfg, v), world_size, v)


def deep_reference(cfg, v=2):
    """The one-process GPT interleaved 1F1B must equal: the same deeper GPT."""
    return deep_enough(cfg, v).new_model()


# torch 2.13's PipelineStage, built without example inputs and outputs (as `torch_schedule`
# builds it), infers the shapes it passes on by running each stage's forward once more on its
# first step (`_forward_metadata_inference`, stage.py); the forward hooks see that call too
TORCH_NOTE = ("torch's PipelineStage runs each stage's forward once more in step 1 to infer "
              "the shapes it passes on (past the first stage on empty, uninitialised inputs): "
              "step 1's activations are not compared, step 2's are; gradients and parameters "
              "are, every step")
