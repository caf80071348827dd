"""The catalogue itself: every strategy of the course, declared once (see this package's
docstring for what an entry says and how to add one)."""

from dataclasses import dataclass, field
from functools import partial

from dlcourse.models import moe_loss
from dlcourse.parallel.combine import GridPlan
from dlcourse.parallel.context import check_cp
from dlcourse.parallel.data.compare import DDP
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor import check_tp
from dlcourse.strategies import (checkpoint, combine, context, data, expert, pipeline, tensor,
                                 zero)
from dlcourse.strategies.config import MATCH_TOLERANCE, StrategyConfig


@dataclass
class Strategy:
    name: str  # as the tour's table and the finder's reports print it
    lesson: str  # the lesson's number, "03" (see `dlcourse.lessons`)
    grid: object  # fn(cfg, world_size) -> the RankGrid it runs on; ValueError: it cannot
    build: object  # fn(cfg, groups) -> Trainer, on every rank (groups: the grid's `RankGroups`)
    ranks: int | None = None  # the one world size it needs (a grid plan's), None: any that fits
    tolerance: float = MATCH_TOLERANCE  # the largest |Δ| vs the reference that still matches
    reference: object = None  # fn(cfg) -> the plain model it must equal (None: cfg's GPT)
    loss: object = None  # fn(model, logits, targets) -> the reference's loss (None: lm_loss)
    # lesson 10's finder runs it at `finder_ranks` on a `DebugConfig` with these fields changed
    finder_ranks: int = 2
    finder_config: dict = field(default_factory=dict)
    note: str = ""  # what the finder cannot compare for it, and why; in its report
    tour: bool = True  # a row of `dlcourse tour` (False: the finder's only, e.g. with dropout)
    finder: bool = True  # a subject of lesson 10's finder (False: it cannot run it, e.g. a kill)
    # fn(cfg) -> the tour's RowResult, from launches of its own after the tour's shared job, for
    # a row that would break that job (a rank that kills itself); it picks its own world size
    own_job: object = None

    def check(self, cfg, world_size):
        """The grid it would run on at `world_size`; ValueError before any rank starts."""
        if self.own_job is not None:  # its own launches, at its own `ranks`
            return None
        if self.ranks is not None and self.ranks != world_size:
            raise NeedsRanks(self.ranks)
        return self.grid(cfg, world_size)


class NeedsRanks(ValueError):
    """A strategy that runs on one world size only, asked for another: not the user's error."""

    def __init__(self, ranks):
        super().__init__(f"needs {ranks} ranks: run it with --world-size {ranks}")
        self.ranks = ranks


def whole(axis, check=None):
    """fn(cfg, world_size) -> RankGrid with every rank on `axis` (check(cfg, world_size) first)."""
    def grid(cfg, world_size):
        if check:
            check(cfg, world_size)
        return RankGrid(**{axis: world_size})
    return grid


def _tp_fits(cfg, world_size):  # tp must divide the heads; sequence parallelism the tokens too
    check_tp(cfg.model, world_size, sequence_parallel=True)


def _cp_fits(method):
    return lambda cfg, world_size: check_cp(cfg.model, world_size, method)


def _plan(name, plan, **kw):
    return Strategy(name, "07", partial(combine.plan_grid, plan), partial(combine.build, plan),
                    ranks=plan.grid.world_size, finder_ranks=plan.grid.world_size, **kw)


# The pipelines the finder runs at 4 ranks are the tour's: 2 stages x 2 data-parallel copies,
# 4 micro-batches on each, which need 2 x 4 rows at least: the tour's own 16 (8 would equal
# seq_len and make the positions (s, h) look like batch rows to its compare.py). At 2 ranks (one
# pipeline) DebugConfig's 2 micro-batches of 2 rows.
PIPELINE = {"global_batch": StrategyConfig().global_batch,
            "pipeline_micro_batches": StrategyConfig().pipeline_micro_batches}
DP_VARIANTS = [("DP naive (lesson 03)", "naive"), ("DP bucketed (lesson 03)", "bucketed"),
               ("DP overlapped (lesson 03)", "overlapped"), ("torch DDP", DDP)]
TP_VARIANTS = [("TP (lesson 04)", "tp"), ("TP + SP (lesson 04)", "tp+sp"),
               ("DTensor TP", "dtensor")]
ZERO_STAGES = [("ZeRO stage 1 (lesson 05)", 1, False), ("ZeRO stage 2 (lesson 05)", 2, False),
               ("ZeRO stage 3 (lesson 05)", 3, False),
               # ZeRO-Offload (Ren et al. 2021) is built on stage 2
               ("ZeRO stage 2 + offload (lesson 05: ZeRO-Offload)", 2, True),
               ("ZeRO stage 3 + offload (lesson 05)", 3, True)]
SCHEDULES = [("PP GPipe (lesson 06)", "GPipe"), ("PP 1F1B (lesson 06)", "1F1B"),
             ("PP ZB-H1 (lesson 06)", "ZB-H1")]

STRATEGIES = [
    *[Strategy(name, "03", whole("dp"), partial(data.build, variant))
      for name, variant in DP_VARIANTS],
    *[Strategy(name, "04", whole("tp", _tp_fits), partial(tensor.build, variant))
      for name, variant in TP_VARIANTS],
    Strategy("TP + dropout (lesson 04)", "04", whole("tp", _tp_fits), tensor.build_dropout,
             reference=tensor.dropout_reference, tour=False),
    *[Strategy(name, "05", whole("dp"), partial(zero.build_zero, stage, offload))
      for name, stage, offload in ZERO_STAGES],
    Strategy("torch ZeroRedundancyOptimizer", "05", whole("dp"), zero.build_zero_redundancy),
    Strategy("torch FSDP2", "05", whole("dp"), zero.build_fsdp2),
    *[Strategy(name, "06", pipeline.pipeline_grid, partial(pipeline.build, schedule))
      for name, schedule in SCHEDULES],
    # 4 blocks give AdamW more near-zero gradients whose fp32 rounding it turns into steps:
    # 1.1e-5 measured at 4 ranks (the same run in float64: 3.5e-15), so 1e-4 here
    Strategy("PP interleaved 1F1B v=2 (lesson 06, deeper GPT)", "06", pipeline.interleaved_grid,
             pipeline.build_interleaved, tolerance=1e-4, reference=pipeline.deep_reference,
             finder_ranks=4, finder_config=PIPELINE),
    Strategy("torch pipelining 1F1B", "06", pipeline.pipeline_grid,
             partial(pipeline.build, pipeline.TORCH), finder_ranks=4, finder_config=PIPELINE,
             note=pipeline.TORCH_NOTE),
    *[_plan(name, plan) for name, plan in combine.PLANS.items()],
    _plan("DP (lesson 07 grid)", GridPlan(RankGrid(dp=2)), tour=False),
    *[Strategy(name, "08", whole("cp", _cp_fits(method)), partial(context.build, method))
      for name, method in context.METHODS.items()],
    Strategy("EP + DP (lesson 09, MoE GPT)", "09", expert.ep_grid, expert.build,
             reference=expert.moe_model, loss=moe_loss),
    # lesson 11's TP run with dropout: killed, relaunched, resumed; compared with it unkilled
    Strategy("TP + kill a rank, resume from checkpoint (lesson 11)", "11", whole("tp"), None,
             ranks=checkpoint.RANKS, tolerance=0.0, finder=False, own_job=checkpoint.kill_row,
             note="a rank killed is no step the finder can record beside one process"),
]

CATALOGUE = {s.name: s for s in STRATEGIES}
assert len(CATALOGUE) == len(STRATEGIES), "two strategies of the catalogue share a name"
