"""Lesson 07's rank grids in the catalogue (`lessons/07_combining.ipynb`): the course GPT on a
grid, each axis one strategy, with `parallel.combine` (lesson 03's DP or lesson 05's ZeRO on dp,
lesson 04's TP on tp, lesson 06's pipeline on pp, lesson 08's context parallelism on cp). Each
plan needs its own number of ranks: 4 for the 2-D grids, 8 for dp x tp x pp."""

from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.zero.measure import held_bytes
from dlcourse.strategies.trainer import Trainer, local_state_bytes

PLANS = {  # catalogue name -> the plan; micro-batches only where a pipeline needs them
    "DP x TP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2)),
    "DP x PP (lesson 07)": GridPlan(RankGrid(dp=2, pp=2), micro_batches=2),
    "TP x PP (lesson 07)": GridPlan(RankGrid(tp=2, pp=2), micro_batches=2),
    "ZeRO-3 x TP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2), zero_stage=3),
    "DP x TP x PP (lesson 07)": GridPlan(RankGrid(dp=2, tp=2, pp=2), micro_batches=2),
    "DP x CP (lessons 07-08)": GridPlan(RankGrid(dp=2, cp=2)),  # the zig-zag ring on cp
}

def plan_grid(plan, cfg, world_size):
    """Before any rank starts: the grid's size is the job's, and the model fits it."""
    plan.grid.check_world_size(world_size)
    plan.check(cfg.model, cfg.global_batch)
    return plan.grid

def build(plan, cfg, groups):
    """Lesson 07's `GridTrainer` for `plan` on `groups` (the plan's grid's); ZeRO clips with
    cfg.max_grad_norm."""
    clip = dict(max_grad_norm=cfg.max_grad_norm) if plan.zero_stage and cfg.max_grad_norm else {}
    trainer = combine(cfg.new_model(), plan, groups, lr=cfg.lr, **clip)
    return Trainer(trainer.modules, trainer.optimizer, trainer.train_step, trainer.full_parameters,
                   lambda: _held_bytes(trainer), dp=(groups.coords["dp"], plan.grid.dp),
                   tp=(groups.coords["tp"], plan.grid.tp),
                   piece=_cp_piece(trainer, groups, cfg) if plan.grid.cp > 1 else None)

def _held_bytes(trainer):
    """Bytes of this rank's parameters, gradients and optimizer state (lesson 05's count, which
    knows ZeRO's shards; a pipeline rank's stages summed)."""
    if len(trainer.modules) == 1:
        return held_bytes(trainer.modules[0], trainer.optimizer).model_state
    return local_state_bytes(trainer.modules, trainer.optimizer)

def _cp_piece(trainer, groups, cfg):
    """cp > 1 on a grid (tp = 1: `GridPlan` refuses SP with cp): fn(reference activation) ->
    this rank's piece: its dp rows of the batch, then its cp tokens (`cp_layout`, as lesson 08's
    strategies); the positions (s, h) have only the tokens. None: not comparable."""
    (dp_rank, dp), cp_rank = (groups.coords["dp"], trainer.plan.grid.dp), groups.coords["cp"]
    s, layout = cfg.model.seq_len, trainer.cp_layout

    def piece(ref):
        if ref.dim() > 2 and ref.size(0) == cfg.global_batch and ref.size(1) == s:
            return layout.shard(ref.tensor_split(dp)[dp_rank], cp_rank, dim=1)
        return layout.shard(ref, cp_rank, dim=0) if ref.size(0) == s else None
    return piece
