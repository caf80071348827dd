"""The strategies the divergence finder can examine, through one interface (lesson 10,
`lessons/10_debugging.ipynb`).

A `Subject` is what the finder needs of a parallel trainer on one rank: its modules (named like
the plain GPT's, for the forward hooks), its optimizer (whose step is intercepted to read the
gradients), a step on the global batch, and the strategy's own unshard helper
(`full_parameters`). The trainers are the ones `dlcourse tour` runs: lesson 07's `combine` for
every plan of a rank grid (plain DP, TP with or without SP, ZeRO 1-3, the pipeline, and their
combinations, `dlcourse.tour.combine.PLANS` included), and lesson 03's wrappers (`wrap`: naive,
bucketed, overlapped, torch DDP) with lesson 03's accumulating `train_step`.

    SUBJECTS["TP + SP (lesson 04)"].build(DebugConfig())   # on every rank of a 2-rank job
"""

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.models import GPTConfig, lm_loss
from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.data import steps
from dlcourse.parallel.data.compare import DDP, wrap
from dlcourse.parallel.grid import RankGrid
from dlcourse.tour.combine import PLANS as TOUR_PLANS
from dlcourse.tour.common import TourConfig


@dataclass
class DebugConfig(TourConfig):
    # a GPT small enough for a test: 2 blocks, 2 heads (tp = 2 divides them), 8 tokens
    model: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16))
    global_batch: int = 4  # sequences per step (5 for an uneven split over 2 ranks)
    steps: int = 2  # optimizer steps compared
    dtype: torch.dtype = torch.float64  # float64: a correct strategy matches to ~1e-15
    max_grad_norm: float | None = None  # clip by the global norm (ZeRO's clip, torch's in the reference)
    micro_batches: int = 1  # lesson 03 subjects: gradient accumulation over this many pieces

    def new_model(self):
        return super().new_model().to(self.dtype)


@dataclass
class Subject:
    modules: list  # this rank's modules; their names are the plain GPT's (a "module." prefix dropped)
    optimizer: object  # its step is intercepted: gradients are read just before it
    train_step: object  # fn(x, y) -> loss: one optimizer step on the global batch
    full_parameters: object  # fn() -> {name: whole tensor}: the strategy's unshard helper
    dp: tuple = (0, 1)  # (dp rank, dp size): rows of the global batch this rank's activations hold
    tp: tuple = (0, 1)  # (tp rank, tp size): an activation cut on dim 1 (SP) is this piece


@dataclass
class Strategy:
    world_size: int  # ranks it runs on
    build: object  # fn(DebugConfig) -> Subject, on every rank


def grid_subject(plan, cfg):
    """Lesson 07's `GridTrainer` for `plan` as a Subject; ZeRO clips with cfg.max_grad_norm."""
    groups = plan.grid.new_groups()
    clip = dict(max_grad_norm=cfg.max_grad_norm) if plan.zero_stage and cfg.max_grad_norm else {}
    trainer = combine(cfg.new_model(), plan, groups, lr=cfg.lr, **clip)
    return Subject(trainer.modules, trainer.optimizer, trainer.train_step, trainer.full_parameters,
                   dp=(groups.coords["dp"], plan.grid.dp), tp=(groups.coords["tp"], plan.grid.tp))


def dp_subject(variant, cfg):
    """Lesson 03's `wrap(variant)` over every rank, trained by lesson 03's `train_step`: this
    rank's shard (uneven allowed, weighted by `uneven_loss_scale`), cut into cfg.micro_batches
    pieces that accumulate under `no_sync`."""
    group = dist.group.WORLD
    model = wrap(variant, cfg.new_model(), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):
        x, y = steps.shard_batch((x, y), group, allow_uneven=True)  # (B/N, T) each
        micro = list(zip(x.chunk(cfg.micro_batches), y.chunk(cfg.micro_batches)))
        scale = steps.uneven_loss_scale(x.size(0), group)  # 1 for an even split
        return steps.train_step(model, optimizer, micro, lm_loss, loss_scale=scale)

    def full_parameters():  # every rank holds a whole replica: its own, to compare rank by rank
        return {n: p.detach().clone() for n, p in model.module.named_parameters()}
    return Subject([model.module], optimizer, train_step, full_parameters,
                   dp=(dist.get_rank(group), dist.get_world_size(group)))


def _grid(plan):
    return Strategy(plan.grid.world_size, partial(grid_subject, plan))


SUBJECTS = {
    **{name: Strategy(2, partial(dp_subject, variant)) for name, variant in [
        ("DP naive (lesson 03)", "naive"), ("DP bucketed (lesson 03)", "bucketed"),
        ("DP overlapped (lesson 03)", "overlapped"), ("torch DDP", DDP)]},
    "DP (lesson 07 grid)": _grid(GridPlan(RankGrid(dp=2))),
    "TP (lesson 04)": _grid(GridPlan(RankGrid(tp=2))),
    "TP + SP (lesson 04)": _grid(GridPlan(RankGrid(tp=2), sequence_parallel=True)),
    **{f"ZeRO stage {k} (lesson 05)": _grid(GridPlan(RankGrid(dp=2), zero_stage=k))
       for k in (1, 2, 3)},
    "PP 1F1B (lesson 06)": _grid(GridPlan(RankGrid(pp=2), micro_batches=2)),
    "PP GPipe (lesson 06)": _grid(GridPlan(RankGrid(pp=2), micro_batches=2, schedule="GPipe")),
    **{name: _grid(plan) for name, plan in TOUR_PLANS.items()},  # lesson 07's 4- and 8-rank grids
}
