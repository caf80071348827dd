"""The strategies the divergence finder can examine, through one interface (lesson 10,
`lessons/10_debugging.ipynb`).

A `Subject` is what the finder needs of a parallel trainer on one rank: its modules (named like
the plain GPT's, for the forward hooks), its optimizer (whose step is intercepted to read the
gradients), a step on the global batch, and the strategy's own unshard helper
(`full_parameters`). The trainers are the ones `dlcourse tour` runs: lesson 07's `combine` for
every plan of a rank grid (plain DP, TP with or without SP, ZeRO 1-3, the pipeline, and their
combinations, `dlcourse.tour.combine.PLANS` included), lesson 03's wrappers (`wrap`: naive,
bucketed, overlapped, torch DDP) with lesson 03's accumulating `train_step`, lesson 08's
context-parallel GPT with the tour's `cp_step`, and lesson 09's expert-parallel MoE GPT with its
`ep_step` (its reference is the same MoE GPT in one process: a `Strategy` names its own), and
lesson 04's TP GPT with dropout, whose one process draws, by construction, the masks its tp
ranks draw between them (`parallel/tensor/dropout.py`, `one_process_dropout`). The
tour's other rows (torch's DTensor TP, FSDP2 and pipelining, ZeRO with offload, interleaved 1F1B)
are in `subjects_tour.py`, added to SUBJECTS at the end: every row of `dlcourse tour` has one.

    SUBJECTS["TP + SP (lesson 04)"].build(DebugConfig())   # on every rank of a 2-rank job
"""

from dataclasses import dataclass, field, replace
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.models import GPTConfig, MoEGPT, lm_loss, moe_loss
from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.context import context_parallel, cp_layout
from dlcourse.parallel.data import steps
from dlcourse.parallel.data.compare import DDP, wrap
from dlcourse.parallel.expert import expert_parallel
from dlcourse.parallel.expert import full_parameters as ep_full_parameters
from dlcourse.parallel.expert.compare import ep_step
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor import full_parameters as tp_full_parameters
from dlcourse.parallel.tensor import parallelize, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.compare import step as tp_step
from dlcourse.parallel.tensor.dropout import one_process_dropout
from dlcourse.parallel.tensor.rng import seed_tensor_parallel
from dlcourse.parallel.zero.torch_api import zero_redundancy
from dlcourse.tour.combine import PLANS as TOUR_PLANS
from dlcourse.tour.common import TourConfig
from dlcourse.tour.context import METHOD_ROWS, cp_step
from dlcourse.tour.experts import moe_config


@dataclass
class DebugConfig(TourConfig):
    # a GPT small enough for a test: 2 blocks, 2 heads (tp = 2 divides them), 8 tokens
    model: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16))
    global_batch: int = 4  # sequences per step (5 for an uneven split over 2 ranks)
    steps: int = 2  # optimizer steps compared
    dtype: torch.dtype = torch.float64  # float64: a correct strategy matches to ~1e-15
    max_grad_norm: float | None = None  # clip by the global norm (ZeRO's; torch's in the reference)
    micro_batches: int = 1  # lesson 03 subjects: gradient accumulation over this many pieces

    def new_model(self):
        return super().new_model().to(self.dtype)


@dataclass
class Subject:
    modules: list  # this rank's modules, named as the plain GPT's (a "module." prefix dropped)
    optimizer: object  # its step is intercepted: gradients are read just before it
    train_step: object  # fn(x, y) -> loss: one optimizer step on the global batch
    full_parameters: object  # fn() -> {name: whole tensor}: the strategy's unshard helper
    dp: tuple = (0, 1)  # (dp rank, dp size): rows of the global batch this rank's activations hold
    tp: tuple = (0, 1)  # (tp rank, tp size): an activation cut on dim 1 (SP) is this piece
    piece: object = None  # fn(reference activation) -> this rank's piece, or None: not comparable
    #                       (None here: the dp and tp rules above)
    activations_from: int = 1  # the first step whose activations are compared (see Strategy.note)


@dataclass
class Strategy:
    world_size: int  # ranks it runs on
    build: object  # fn(DebugConfig) -> Subject, on every rank
    reference: object = None  # fn(DebugConfig) -> the plain model it must equal (None: the GPT)
    loss: object = None  # fn(model, logits, targets) -> the reference's loss (None: lm_loss)
    note: str = ""  # what the finder cannot compare for this strategy, and why; in its report
    config: dict = field(default_factory=dict)  # DebugConfig fields it needs (a case without one)


def grid_subject(plan, cfg):
    """Lesson 07's `GridTrainer` for `plan` as a Subject; ZeRO clips with cfg.max_grad_norm."""
    groups = plan.grid.new_groups()
    clip = dict(max_grad_norm=cfg.max_grad_norm) if plan.zero_stage and cfg.max_grad_norm else {}
    trainer = combine(cfg.new_model(), plan, groups, lr=cfg.lr, **clip)
    return Subject(trainer.modules, trainer.optimizer, trainer.train_step, trainer.full_parameters,
                   dp=(groups.coords["dp"], plan.grid.dp), tp=(groups.coords["tp"], plan.grid.tp),
                   piece=grid_cp_piece(trainer, groups, cfg) if plan.grid.cp > 1 else None)


def grid_cp_piece(trainer, groups, cfg):
    """cp > 1 on a grid (tp = 1: `GridPlan` refuses SP with cp): fn(reference activation) ->
    this rank's piece: its dp rows of the batch, then its cp tokens (`cp_layout`, as lesson 08's
    `cp_subject`); the positions (s, h) have only the tokens. None: not comparable."""
    (dp_rank, dp), cp_rank = (groups.coords["dp"], trainer.plan.grid.dp), groups.coords["cp"]
    s, layout = cfg.model.seq_len, trainer.cp_layout

    def piece(ref):
        if ref.dim() > 2 and ref.size(0) == cfg.global_batch and ref.size(1) == s:
            return layout.shard(ref.tensor_split(dp)[dp_rank], cp_rank, dim=1)
        return layout.shard(ref, cp_rank, dim=0) if ref.size(0) == s else None
    return piece


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


def zero_redundancy_subject(cfg):
    """torch's ZeroRedundancyOptimizer (AdamW state sharded) around DDP, as the tour runs it."""
    group = dist.group.WORLD
    model, optimizer = zero_redundancy(cfg.new_model(), group, lr=cfg.lr)

    def train_step(x, y):
        x, y = steps.shard_batch((x, y), group)
        return steps.train_step(model, optimizer, [(x, y)], lm_loss)
    full = lambda: dict(model.module.named_parameters())  # noqa: E731  (whole on every rank)
    return Subject([model.module], optimizer, train_step, full,
                   dp=(dist.get_rank(group), dist.get_world_size(group)))


def cp_subject(method, cfg):
    """Lesson 08's context-parallel GPT over every rank, `method` one of its METHODS: each rank
    holds its s/cp tokens of every sequence (`cp_layout`: contiguous or zig-zag chunks)."""
    group, rank = dist.group.WORLD, dist.get_rank()
    layout = cp_layout(cfg.model, group, method)
    model = context_parallel(cfg.new_model(), group, method)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):
        return cp_step(model, optimizer, *(layout.shard(t, rank) for t in (x, y)), group).item()

    def piece(ref):  # this rank's tokens: dim 1 of (B, s, ...), dim 0 of the positions (s, h)
        s = cfg.model.seq_len
        dim = 1 if ref.dim() > 2 and ref.size(1) == s else 0 if ref.size(0) == s else None
        return None if dim is None else layout.shard(ref, rank, dim=dim)
    full = lambda: {n: p.detach().clone() for n, p in model.named_parameters()}  # noqa: E731
    return Subject([model], optimizer, train_step, full, piece=piece)


def ep_subject(cfg):
    """Lesson 09's MoE GPT, E/ep experts per rank and the dense weights replicated, each rank on
    its slice of the batch; `expert.full_parameters` gathers the experts."""
    group = dist.group.WORLD
    # cut in float32, then cast: GroupedLinear.narrow builds its block in the default dtype
    model = expert_parallel(moe_model(cfg, torch.float32), group).to(cfg.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):
        return ep_step(model, optimizer, *steps.shard_batch((x, y), group), group).item()
    return Subject([model], optimizer, train_step, partial(ep_full_parameters, model, group),
                   dp=(dist.get_rank(group), dist.get_world_size(group)))


def moe_model(cfg, dtype=None):
    """The tour's MoE GPT (E = 4, top-2) on the debug config's GPT, in cfg.dtype (or `dtype`)."""
    return MoEGPT(moe_config(cfg), seed=cfg.seed).to(cfg.device(), dtype or cfg.dtype)


TP_DROPOUT = 0.1  # the dropout of "TP + dropout": GPT-2's, in all three of a block's dropouts


def tp_dropout_subject(cfg, p=TP_DROPOUT):
    """Lesson 04's TP GPT over every rank with dropout p, its masks from lesson 04's `RNGTracker`
    (`parallelize(..., tracker=)`): the heads' per rank, the residual ones alike on every rank."""
    group = dist.group.WORLD
    model = _with_dropout(cfg, p).new_model()
    tracker = seed_tensor_parallel(cfg.seed, group)  # after the model: its layers draw at init
    model = parallelize(model, group, tracker=tracker)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss_fn = partial(vocab_parallel_lm_loss, group=group)
    train_step = lambda x, y: tp_step(model, optimizer, loss_fn, x, y).item()  # noqa: E731
    return Subject([model], optimizer, train_step, partial(tp_full_parameters, model, group),
                   tp=(dist.get_rank(group), dist.get_world_size(group)))


def tp_dropout_reference(cfg, p=TP_DROPOUT, tp=2):
    """Its one process: the GPT whose masks are by construction those tp ranks draw between
    them (`dropout.one_process_dropout`), from seeds of their own, the default stream untouched."""
    return one_process_dropout(_with_dropout(cfg, p).new_model(), tp, cfg.seed)


def _with_dropout(cfg, p):
    return replace(cfg, model=replace(cfg.model, dropout=p))


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
    "PP ZB-H1 (lesson 06)": _grid(GridPlan(RankGrid(pp=2), micro_batches=2, schedule="ZB-H1")),
    "torch ZeroRedundancyOptimizer": Strategy(2, zero_redundancy_subject),
    **{name: _grid(plan) for name, plan in TOUR_PLANS.items()},  # lesson 07's 4- and 8-rank grids
    **{name: Strategy(2, partial(cp_subject, method)) for name, method in METHOD_ROWS.items()},
    "EP + DP (lesson 09, MoE GPT)": Strategy(2, ep_subject, reference=moe_model,
                                             loss=moe_loss),
    "TP + dropout (lesson 04)": Strategy(2, tp_dropout_subject, reference=tp_dropout_reference),
}

# The tour rows built outside lesson 07's combine (DTensor TP, FSDP2, ZeRO offload, torch's
# pipelining, interleaved 1F1B): imported last, as they build on Subject and Strategy above.
from dlcourse.debug.subjects_tour import TOUR_SUBJECTS  # noqa: E402

SUBJECTS.update(TOUR_SUBJECTS)
