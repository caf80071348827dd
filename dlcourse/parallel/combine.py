"""The strategies combined on one rank grid (lesson 07, `lessons/07_combining.ipynb`).

A job of pp x dp x cp x tp ranks (`RankGrid`) trains the course GPT with up to four strategies
at once, one per axis of the grid:

    pp   pipeline: each rank holds a run of consecutive blocks (lesson 06's `cut_stages`)
    tp   tensor parallel inside the stage: 1/tp of every weight matrix (lesson 04)
    cp   context parallel: 1/cp of every sequence's tokens, K/V passed by `cp_method` (lesson 08;
         pp = 1, no sequence parallelism)
    dp   data parallel around whatever the rank holds: replicas average their gradients
         (lesson 03), or ZeRO partitions the model state between them (lesson 05, pp = 1);
         with cp > 1 the replicas are the dp x cp ranks that hold the same weights

    plan = GridPlan(RankGrid(dp=2, tp=2, pp=2), micro_batches=2)
    plan.check(config, batch=8)                      # before any process starts
    # on every rank of the job:
    groups = plan.grid.new_groups()                  # once; every strategy gets its axis' group
    trainer = combine(GPT(config), plan, groups, lr=1e-3)
    loss = trainer.train_step(x, y)                  # the global batch; a rank takes its dp shard
    trainer.full_parameters()                        # {name: whole tensor}, for the proofs

Each strategy is the lesson's own code, handed the group of its axis; the only glue is here.
A rank's tp group holds the same stage and the same data, its dp group the same stage and the
same shards, its pp group the same tp shard of every stage: so every collective of a strategy
runs between ranks that hold matching pieces. A cp group holds the same weights and the same
sequences, a different part of each; so with cp > 1 the gradients are averaged over dp x cp
ranks (`groups.dp_cp`), not dp alone: each rank's loss is the mean over as many tokens.
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.memory import gpt_saved_tensors
from dlcourse.models import lm_loss
from dlcourse.parallel.data.buckets import all_reduce_buckets, make_buckets
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.context.measure import cp_saved_tensors
from dlcourse.parallel.context.parallelize import (METHODS, check_cp, context_parallel, cp_layout,
                                                   cp_model)
from dlcourse.parallel.context.ulysses import check_ulysses
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.rules import Run, refuse
from dlcourse.parallel.pipeline import SCHEDULES, cut_stages, split_micro_batches, stage_boundaries
from dlcourse.parallel.pipeline import train_step as pipeline_train_step
from dlcourse.parallel.pipeline.measure import in_flight_peak
from dlcourse.parallel.tensor import (ColumnParallelLinear, VocabParallelEmbedding, check_tp,
                                      parallelize, unshard, vocab_parallel_lm_loss)
from dlcourse.parallel.tensor.activations import tp_saved_tensors
from dlcourse.parallel.tensor.parallelize import parallel_block
from dlcourse.parallel.zero import ZeroAdamW, zero

PIPELINE_SCHEDULES = ("naive", "GPipe", "1F1B", "ZB-H1")  # one stage per rank (v = 1)


@dataclass(frozen=True)
class GridPlan:
    grid: RankGrid  # the sizes of the dp, cp, tp and pp axes and their order
    zero_stage: int = 0  # 0: plain data parallelism on dp; 1, 2, 3: ZeRO's stage on dp (x cp)
    micro_batches: int = 1  # per dp replica and step; the pipeline needs at least pp
    schedule: str = "1F1B"  # the pipeline schedule (lesson 06), when pp > 1
    sequence_parallel: bool = False  # Korthikanti et al.'s sequence parallelism on tp (pp = 1)
    cp_method: str = "zigzag"  # lesson 08's METHODS, when cp > 1: the balanced ring by default

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"GridPlan.zero_stage is 0 (plain data parallel) or ZeRO's stage "
                             f"1, 2 or 3, got {self.zero_stage!r}")
        if self.schedule not in PIPELINE_SCHEDULES:
            raise ValueError(f"GridPlan.schedule must be one of {PIPELINE_SCHEDULES} (one stage "
                             f"per rank), got {self.schedule!r}")
        if self.cp_method not in METHODS:
            raise ValueError(f"GridPlan.cp_method must be one of {sorted(METHODS)}, "
                             f"got {self.cp_method!r}")
        refuse(self.grid, None, self.run)  # the combinations not built here (rules.py)

    @property
    def run(self):
        """How this plan runs its grid, as the rule book (`dlcourse.parallel.rules`) reads it."""
        return Run(micro_batches=self.micro_batches, zero_stage=self.zero_stage, sequence_parallel=self.sequence_parallel,
                   cp_method=self.cp_method)

    def check(self, config, batch):
        """Refuse, with the arithmetic, a grid the model or the batch (None: not checked)
        cannot be cut into."""
        refuse(self.grid, config, self.run)  # the rule book the planner reads too
        check_tp(config, self.grid.tp, self.sequence_parallel)  # dropout with tp and SP
        if self.grid.cp > 1:  # cp (zig-zag: 2 cp) divides seq_len; dropout 0
            check_cp(config, self.grid.cp, self.cp_method)
            if self.cp_method == "ulysses":  # Ulysses splits each tp rank's a/tp heads over cp
                check_ulysses(config.n_heads // self.grid.tp, self.grid.cp)
        dp, m = self.grid.dp, self.micro_batches
        if batch is not None and batch % (dp * m):
            raise ValueError(
                f"a batch of {batch} sequences does not split into dp {dp} x {m} micro-batches "
                f"({batch} / {dp * m} = {batch / (dp * m):g}): use a multiple of {dp * m}")


class GridTrainer:
    """One rank's part of the combined model and its optimizer; `combine` builds it."""

    def __init__(self, plan, groups, modules, optimizer, loss_fn, tp_layout, cp_layout=None):
        self.plan, self.groups = plan, groups
        self.modules = modules  # pp = 1: [the (TP, ZeRO) model]; pp > 1: this rank's [Stage]
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.tp_layout = tp_layout  # name -> (tp_dim, tp_parts) of each tp-sharded parameter
        replicas = plan.grid.dp * plan.grid.cp  # ranks that hold the same weights
        plain_dp = plan.grid.pp == 1 and not plan.zero_stage and replicas > 1
        self.dp_buckets = make_buckets(modules[0]) if plain_dp else None  # lesson 03, step 2
        self.cp_layout = cp_layout  # cp > 1: lesson 08's `Layout`, which tokens this rank holds

    def train_step(self, x, y):
        """One AdamW step on the global batch (B, T). Returns this rank's loss (the mean over
        its dp shard, and its cp part of each sequence), or None on a pipeline rank without
        the last stage."""
        x, y = shard_batch((x, y), self.groups.dp)  # (B/dp, T): the same on a tp or pp group
        if self.cp_layout is not None:  # (B/dp, T/cp): this rank's chunks, the same on tp
            x, y = (self.cp_layout.shard(t, dist.get_rank(self.groups.cp)) for t in (x, y))
        if self.plan.grid.pp > 1:
            return self._pipeline_step(x, y)
        model = self.modules[0]
        self.optimizer.zero_grad()
        loss = self.loss_fn(model(x), y)
        loss.backward()  # TP's on groups.tp, CP's K/V on groups.cp, ZeRO 2/3's on groups.dp_cp
        if self.dp_buckets is not None:  # averaged over dp x cp (dp alone when cp = 1)
            all_reduce_buckets(self.dp_buckets, self.groups.dp_cp)
        self.optimizer.step()  # ZeroAdamW: reduce-scatter, Adam on the shard, all-gather
        return loss.item()

    def _pipeline_step(self, x, y):
        micro = split_micro_batches(x, y, self.plan.micro_batches)  # m x (B/(dp m), T)
        dp_group = self.groups.dp if self.plan.grid.dp > 1 else None
        return pipeline_train_step(self.modules, self.optimizer, SCHEDULES[self.plan.schedule],
                                   micro, self.groups.pp, dp_group=dp_group)

    @torch.no_grad()
    def full_parameters(self):
        """{name: the whole parameter}, the plain GPT's names, on every rank: gathered over dp
        (ZeRO-3), put back together over tp, collected over pp. Call on every rank."""
        local = {}
        for module in self.modules:
            if self.plan.zero_stage:
                full = module.full_parameters()  # ZeRO-3 all-gathers over dp
                local.update({name: t.detach().clone() for name, t in full.items()})
            else:
                local.update(_own_parameters(module))
        whole = {name: _unshard(t, self.tp_layout.get(name), self.groups.tp)
                 for name, t in local.items()}  # the same order on every tp rank
        if self.plan.grid.pp == 1:
            return whole
        pieces = [None] * self.plan.grid.pp
        dist.all_gather_object(pieces, whole, group=self.groups.pp)  # stage by stage
        return {name: t for piece in pieces for name, t in piece.items()}


def combine(model, plan, groups, lr=1e-3, **adamw_kwargs):
    """The plain course GPT -> this rank's `GridTrainer` for `plan`, using `groups` (from
    `plan.grid.new_groups()`). pp = 1: TP over groups.tp, then CP over groups.cp on the TP
    model (its a/tp heads), then plain DP or ZeRO over groups.dp_cp (groups.dp when cp = 1).
    pp > 1: cut into stages over groups.pp, TP inside each stage, DP over groups.dp.
    TP, CP and PP build copies; with tp = cp = pp = 1 the model itself is trained (ZeRO moves
    its parameters into flat buffers), as DDP trains the module it wraps."""
    plan.grid.check_world_size(dist.get_world_size())
    plan.check(model.config, batch=None)
    tp = plan.grid.tp
    if plan.grid.pp > 1:
        stages = cut_stages(model, groups.pp)  # [this rank's Stage], plain layers
        if tp > 1:
            stages = [tensor_parallel_stage(s, groups.tp) for s in stages]
        optimizer = torch.optim.AdamW([p for s in stages for p in s.parameters()], lr=lr,
                                      **adamw_kwargs)
        return GridTrainer(plan, groups, stages, optimizer, lm_loss, _tp_layout(stages))
    if tp > 1:
        model = parallelize(model, groups.tp, plan.sequence_parallel)  # logits (B, T, V/tp)
    if plan.grid.cp > 1:  # the TP model holds groups, so it is changed in place, not copied
        cp_parallel = cp_model if tp > 1 else context_parallel
        model = cp_parallel(model, groups.cp, plan.cp_method)  # logits (B, T/cp, V/tp)
    layout = _tp_layout([model])
    tokens = cp_layout(model.config, groups.cp, plan.cp_method) if plan.grid.cp > 1 else None
    loss_fn = partial(vocab_parallel_lm_loss, group=groups.tp) if tp > 1 else lm_loss
    if plan.zero_stage:
        model = zero(plan.zero_stage, model, groups.dp_cp)  # what this tp rank holds, over dp x cp
        optimizer = ZeroAdamW(model, lr=lr, **adamw_kwargs)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, **adamw_kwargs)
    return GridTrainer(plan, groups, [model], optimizer, loss_fn, layout, tokens)


def activation_formula(config, plan, batch):
    """The most activation bytes a rank of `plan` holds at once in a step on `batch` sequences,
    fp32, dropout 0, from the lessons' counts: lesson 01's saved tensors of the plain GPT
    (`gpt_saved_tensors`) or lesson 04's of one tp rank (`tp_saved_tensors`), for the blocks and
    ends of a rank's stage (lesson 06's `stage_boundaries`) on one micro-batch of
    batch / (dp x m) sequences, times the micro-batches its schedule holds at once
    (`in_flight_peak`); the busiest rank's. The batch itself is not counted. With cp > 1
    (tp = 1): lesson 08's saved tensors of one cp rank (`cp_saved_tensors`) on batch / dp, and
    this rank's token ids and targets, int64 copies the step cuts out of the batch (a zig-zag
    shard is no view of it) that the embedding and the loss save."""
    g, m = plan.grid, plan.micro_batches
    micro = batch // (g.dp * m)
    if g.cp > 1:
        if g.tp > 1:
            raise ValueError("no activation count for cp with tp here: lesson 08 counts a cp "
                             "rank of the plain GPT, lesson 04 a tp rank without cp")
        shards = 2 * micro * (config.seq_len // g.cp) * 8  # ids and targets, (B/dp, s/cp)
        return shards + sum(r.nbytes for r in cp_saved_tensors(config, micro, g.cp,
                                                                plan.cp_method))
    bounds = stage_boundaries(config.n_layers, g.pp)
    per_stage = {s: _stage_activation_bytes(config, micro, g.tp, s == 0, s == g.pp - 1,
                                            bounds[s + 1] - bounds[s], plan.sequence_parallel)
                 for s in range(g.pp)}
    actions = SCHEDULES[plan.schedule]
    kept = {s: per_stage[s] - (_loss_bytes(config, micro) if 0 < s == g.pp - 1 else 0)
            for s in range(g.pp)}  # zero bubble's B (torch's split) frees only the loss's rows
    return max(in_flight_peak(actions(r, g.pp, m), per_stage, kept) for r in range(g.pp))


def _loss_bytes(config, batch):
    """What lesson 06's zero-bubble B frees on the last stage: the loss's saved tensors, which lie
    above the last weight (the rest of the graph waits for W)."""
    return sum(r.numel * r.itemsize * r.count for r in gpt_saved_tensors(config, batch)
               if r.where == "loss" and r.kind == "activations")


def _stage_activation_bytes(config, batch, tp, first, last, blocks, sequence_parallel):
    """Bytes one micro-batch leaves saved on a stage: its ends' rows and `blocks` block rows.
    A tp stage inside a pipeline gathers the logits and takes the plain loss (see
    `tensor_parallel_stage`), so its loss rows are the plain GPT's."""
    plain = gpt_saved_tensors(config, batch)
    rows = tp_saved_tensors(config, batch, tp, sequence_parallel) if tp > 1 else plain
    if tp > 1 and not (first and last):  # a pipeline's last stage: lm_loss on whole logits
        rows = [r for r in rows if r.where != "loss"] + [r for r in plain if r.where == "loss"]
    wanted = {"block"} | ({"embedding"} if first else set()) | ({"head", "loss"} if last else set())
    return sum(r.numel * r.itemsize * (blocks if r.where == "block" else r.count)
               for r in rows if r.where in wanted and r.kind == "activations")


def tensor_parallel_stage(stage, group):
    """The adapter that puts lesson 04 inside a lesson 06 stage, in place: its blocks get
    `parallel_block`, the token embedding becomes vocabulary-parallel, and the output layer
    column-parallel over the vocabulary with gather_output=True, so the last stage hands the
    pipeline's `lm_loss` whole logits (b, T, V) (one all-gather of b T V values per micro-batch
    on the tp axis; Megatron-LM keeps the loss vocabulary-parallel instead and sends 3 b T).
    The tied embedding's two copies stay on two ranks; `sync_tied_grads` over the pp group sums
    their gradients shard by shard, as both ends cut the vocabulary the same way."""
    for key, block in stage.blocks.items():
        stage.blocks[key] = parallel_block(block, group, sequence_parallel=False)
    if stage.is_first:
        stage.tok_emb = VocabParallelEmbedding(stage.tok_emb, group)
    if stage.is_last:
        stage.lm_head = ColumnParallelLinear(stage.lm_head, group, gather_output=True)
        if stage.is_first and stage.tied:
            stage.lm_head.weight = stage.tok_emb.weight
    return stage


def _own_parameters(module):
    """{name: tensor} this rank holds; a stage's second copy of the tied matrix is left out."""
    tied = getattr(module, "tied", False)
    return {name: p.detach().clone() for name, p in module.named_parameters()
            if not (tied and name == "lm_head.weight")}


def _tp_layout(modules):
    return {name: (p.tp_dim, p.tp_parts) for m in modules for name, p in m.named_parameters()
            if hasattr(p, "tp_dim")}


def _unshard(tensor, layout, tp_group):
    """The whole tensor from every tp rank's shard (all-gather), or `tensor` if not sharded."""
    if layout is None:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(dist.get_world_size(tp_group))]
    dist.all_gather(shards, tensor.contiguous(), group=tp_group)
    return unshard(shards, *layout)
