"""The tour rows that lesson 07's `combine` does not build, as the divergence finder's subjects
(lesson 10, `lessons/10_debugging.ipynb`): torch's DTensor tensor parallelism and FSDP2, ZeRO
with its optimizer offloaded to the CPU, torch.distributed.pipelining's Schedule1F1B and
lesson 06's interleaved 1F1B. Each is built by the code its `dlcourse tour` row runs
(`tensor.compare.build`, `tour.zero.MAKERS`, `cut_stages` with the tour's `pipeline_grid` and
`N_MICRO`), and reads whole tensors the strategy's own way:

    DTensor TP         `dtensor_full_parameters`: each DTensor's full_tensor(), qkv rows reordered
    FSDP2              `fsdp2_full_parameters`: full_tensor() of each dim-0 sharded DTensor
    ZeRO + offload     the stage's `full_parameters` (its shards' all-gather)
    the pipelines      `gather_params`: every stage's parameters, collected over the pp group

Gradients go through the same helpers (`capture.gradients_shown` lends each parameter, DTensor
or not, its gradient as its value). Forward hooks see every one's modules, named as the GPT's;
what the finder cannot compare for one (torch's pipeline: step 1's activations) is said in its
`Strategy.note`, which its report prints.
"""

from functools import partial

import torch
import torch.distributed as dist

from dlcourse.debug.subjects import Strategy, Subject
from dlcourse.models import lm_loss
from dlcourse.parallel.data import steps
from dlcourse.parallel.pipeline import SCHEDULES, cut_stages, gather_params, split_micro_batches
from dlcourse.parallel.pipeline import train_step as pipeline_train_step
from dlcourse.parallel.pipeline.torch_api import torch_schedule, torch_train_step
from dlcourse.parallel.tensor.compare import build as build_tp
from dlcourse.parallel.tensor.compare import step as tp_step
from dlcourse.tour.common import TourConfig
from dlcourse.tour.pipeline import N_MICRO, TORCH, deep_enough, pipeline_grid
from dlcourse.tour.zero import MAKERS as ZERO_MAKERS


def dtensor_subject(cfg):
    """Lesson 04's DTensor TP (the tour's "dtensor" variant) over every rank: every rank on the
    whole batch; column-parallel outputs and the vocabulary-sharded logits are pieces the finder
    does not compare (as for the from-scratch TP), the next whole activation carries any error."""
    group = dist.group.WORLD
    model, loss_fn, gather = build_tp("dtensor", cfg.new_model(), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):  # under loss_parallel, as the tour's row steps it
        return tp_step(model, optimizer, loss_fn, x, y).item()
    return Subject([model], optimizer, train_step, partial(gather, model))


def zero_row_subject(variant, cfg):
    """A `tour.zero.MAKERS` row ("FSDP2", "stage 2 + offload", "stage 3 + offload"), each rank on
    its contiguous slice of the batch, built and unsharded as the tour builds it."""
    group = dist.group.WORLD
    model, optimizer, full_parameters, _ = ZERO_MAKERS[variant](cfg, group)

    def train_step(x, y):
        return steps.train_step(model, optimizer, [steps.shard_batch((x, y), group)], lm_loss)
    return Subject([model], optimizer, train_step, full_parameters,
                   dp=(dist.get_rank(group), dist.get_world_size(group)))


def pipeline_subject(schedule, cfg, v=1):
    """The tour's pipeline row for `schedule` (TORCH: torch's Schedule1F1B, else a name of
    lesson 06's SCHEDULES): pp x dp ranks from `pipeline_grid`, N_MICRO micro-batches per
    pipeline, v stages per rank. Its modules are this rank's stages, named as the GPT's."""
    groups = pipeline_grid(cfg, v).new_groups()
    stages = cut_stages(cfg.new_model(), groups.pp, v)
    optimizer = torch.optim.AdamW([p for s in stages for p in s.parameters()], lr=cfg.lr)
    if schedule == TORCH:
        torch_steps = torch_schedule("1F1B", stages, N_MICRO, groups.pp)

    def train_step(x, y):
        x, y = steps.shard_batch((x, y), groups.dp)  # this pipeline's slice
        if schedule == TORCH:
            return torch_train_step(torch_steps, stages, optimizer, x, y, groups.pp, groups.dp)
        return pipeline_train_step(stages, optimizer, SCHEDULES[schedule],
                                   split_micro_batches(x, y, N_MICRO), groups.pp, v=v,
                                   dp_group=groups.dp)
    return Subject(stages, optimizer, train_step, partial(gather_params, stages, groups.pp),
                   dp=(dist.get_rank(groups.dp), dist.get_world_size(groups.dp)),
                   activations_from=2 if schedule == TORCH else 1)  # see TORCH_NOTE


def interleaved_subject(cfg, v=2):
    """Interleaved 1F1B, v chunks per rank, on the tour's deeper GPT (`deep_enough`)."""
    return pipeline_subject("interleaved 1F1B", deep_enough(cfg, v), v)


def deep_reference(cfg, v=2):
    """The one-process GPT interleaved 1F1B must equal: the same deeper GPT, in cfg's dtype."""
    return deep_enough(cfg, v).new_model()


# torch 2.13's PipelineStage, built without example inputs and outputs (as `torch_schedule`
# builds it), infers the shapes it passes on by running each stage's forward once more on its first
# step (`_forward_metadata_inference`, stage.py); the forward hooks see that call too
TORCH_NOTE = ("torch's PipelineStage runs each stage's forward once more in step 1 to infer "
              "the shapes it passes on (past the first stage on empty, uninitialised inputs): "
              "step 1's activations are not compared, step 2's are; gradients and parameters "
              "are, every step")

# The pipelines at the tour's default 4 ranks: 2 stages x 2 data-parallel copies (`pipeline_grid`),
# so the gradients' average over dp runs too. N_MICRO micro-batches on each copy need 2 x 4 rows
# at least; the tour's own 16, as 8 would equal seq_len and make the positions (s, h) look like
# batch rows to compare.py (measured: pos_emb then went uncompared)
PIPELINE_CONFIG = {"global_batch": TourConfig().global_batch}

TOUR_SUBJECTS = {  # tour row name -> Strategy; 2 ranks for the others (tp = 2 divides 2 heads)
    "DTensor TP": Strategy(2, dtensor_subject),
    "ZeRO stage 2 + offload (lesson 05: ZeRO-Offload)": Strategy(
        2, partial(zero_row_subject, "stage 2 + offload")),
    "ZeRO stage 3 + offload (lesson 05)": Strategy(2, partial(zero_row_subject,
                                                                "stage 3 + offload")),
    "torch FSDP2": Strategy(2, partial(zero_row_subject, "FSDP2")),
    "PP interleaved 1F1B v=2 (lesson 06, deeper GPT)": Strategy(
        4, interleaved_subject, reference=deep_reference, config=PIPELINE_CONFIG),
    "torch pipelining 1F1B": Strategy(4, partial(pipeline_subject, TORCH), note=TORCH_NOTE,
                                      config=PIPELINE_CONFIG),
}
