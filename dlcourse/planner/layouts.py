"""Layouts: one way to spread a training step over a cluster, and the rules it must obey
(lesson 07's planner).

A layout is a grid dp x cp x tp x pp (tp innermost, as `dlcourse.parallel.grid` orders it, so
tensor parallel stays in a node; context parallel next, as Megatron-LM orders it, so its
all-gathers stay as close as they can), the ZeRO stage on the dp axis, how the batch is cut (micro-batch size
and count), activation recomputation, and the pipeline's interleaving. `problems` lists every
rule a layout breaks, each with its arithmetic; `layouts` enumerates the ones worth estimating.
"""

import math
from dataclasses import dataclass, field, replace

from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.rules import Run
from dlcourse.parallel.rules import problems as grid_problems
from dlcourse.planner.activations import MLP
from dlcourse.planner.transients import LOSS

RECOMPUTE = ("none", "selective", "op", "full")  # "op": torchtitan's by-op policy
ATTENTION = ("fused", "eager")  # FlashAttention / SDPA's fused kernel, or the scores in memory


@dataclass(frozen=True)
class Workload:
    """What to train: a `ModelSpec` (dlcourse.memory.calculator), its sequence length, the
    global batch of one optimizer step, in tokens, and the attention kernel: "fused"
    (FlashAttention, torch's SDPA: the s x s scores never stored, recomputed in backward) or
    "eager" (softmax(QK^T) materialised and saved, as lesson 01 measures it); and the SwiGLU
    MLP's kernel: "eager" (plain autograd, as torchtitan and lesson 01 run it: four ffn-wide
    tensors saved) or "fused" (Megatron-LM's, three; `activations.py`). GELU MLPs save the
    same two tensors either way. The loss: "in place" (Megatron-LM's cross-entropy, 6 bytes a
    logit at its peak), "fp32 eager" (torchtitan's cross_entropy(pred.float()), 12) or "fp32
    eager, pred kept" (torchtitan's of April 2024, fp32 logits held through backward, 16;
    `transients.py`)."""

    model: object  # ModelSpec
    seq_len: int
    batch_tokens: int  # tokens per optimizer step (global batch x seq_len)
    attention: str = "fused"  # "fused" or "eager"
    mlp: str = "eager"  # "eager" or "fused" (SwiGLU's kernel)
    loss: str = "in place"  # the loss's kernel, by its peak: one of transients.LOSS

    def __post_init__(self):
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.mlp not in MLP:
            raise ValueError(f"mlp must be one of {MLP}, got {self.mlp!r}")
        if self.loss not in LOSS:
            raise ValueError(f"loss must be one of {LOSS}, got {self.loss!r}")

    @property
    def sequences(self):
        return self.batch_tokens // self.seq_len


@dataclass(frozen=True)
class Layout:
    dp: int  # data-parallel replicas (ZeRO shards over them)
    tp: int  # tensor-parallel ranks, inside a node
    pp: int  # pipeline stages
    zero_stage: int = 0  # 0 (plain DP), 1, 2 or 3 on the dp axis
    micro_batch: int = 1  # sequences per micro-batch
    micro_batches: int = 1  # m: micro-batches per step on each pipeline (accumulation if pp = 1)
    recompute: str = "none"  # "none", "selective" (attention scores), "op" (torchtitan's by-op
    #                          policy: every other matmul and the cheap ops) or "full" (layers)
    interleave: int = 1  # v: model chunks per pipeline rank (interleaved 1F1B); 1 = plain 1F1B
    sequence_parallel: bool = field(default=None)  # default: on whenever tp > 1
    reshard: bool = True  # ZeRO-3: free gathered parameters after forward (FSDP's default)
    light_ends: bool = False  # one layer fewer on the first and last stage (Llama 3, §3.3.2)
    cp: int = 1  # context-parallel ranks: each sequence split into cp parts (lesson 08)
    ep: int = 1  # expert-parallel ranks (lesson 09), borrowed from dp x cp x tp: E/ep experts each

    def __post_init__(self):
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)

    @property
    def n_gpus(self):
        return self.dp * self.cp * self.tp * self.pp

    @property
    def replicas(self):
        """Ranks that hold the same parameters and reduce their gradients together (and that
        ZeRO shards over): dp x cp, as every cp rank trains the same weights on its part of the
        sequence (Megatron-LM folds cp into the gradient reduction the same way)."""
        return self.dp * self.cp

    @property
    def grid(self):
        """This layout's grid in the runtime's own description (`dlcourse.parallel.grid`), the
        one the rule book (`dlcourse.parallel.rules`) checks."""
        return RankGrid(dp=self.dp, tp=self.tp, pp=self.pp, cp=self.cp, virtual=self.interleave,
                        ep=self.ep)

    @property
    def run(self):
        """How this layout runs its grid, as the rule book reads it."""
        return Run(micro_batches=self.micro_batches, zero_stage=self.zero_stage,
                   sequence_parallel=self.sequence_parallel, light_ends=self.light_ends,
                   recompute=self.recompute)

    def grid_plan(self):
        """The runtime's `GridPlan` of this layout (lesson 07's `combine` trains it), for a
        layout the rule book passes with where="dlcourse"."""
        from dlcourse.parallel.combine import GridPlan
        return GridPlan(self.grid, zero_stage=self.zero_stage, micro_batches=self.micro_batches,
                        sequence_parallel=self.sequence_parallel)

    def axes(self):
        """How many strategies this layout combines (an axis counts when its size is > 1)."""
        return sum(size > 1 for size in (self.dp, self.cp, self.tp, self.pp))

    def describe(self):
        parts = [f"dp{self.dp}"] + ([f"cp{self.cp}"] if self.cp > 1 else [])
        parts += [f"tp{self.tp}", f"pp{self.pp}"] + ([f"ep{self.ep}"] if self.ep > 1 else [])
        if self.zero_stage:
            parts.append(f"zero{self.zero_stage}" + ("" if self.reshard or self.zero_stage < 3
                                                     else " no-reshard"))
        if self.interleave > 1:
            parts.append(f"v{self.interleave}")
        if self.light_ends:
            parts.append("light ends")
        parts.append(f"mb{self.micro_batch}x{self.micro_batches}")
        if self.recompute != "none":
            parts.append(f"{self.recompute} recompute")
        return " ".join(parts)


def problems(layout, work, cluster, where="megatron"):
    """Every rule `layout` breaks for `work` on `cluster`, each a sentence with the arithmetic;
    [] if it is a valid layout. The grid's rules are the runtime's own rule book
    (`dlcourse.parallel.rules.problems`: where="megatron" the rules every framework has,
    "dlcourse" also what this course's runtime does not build); the rest are the cluster's and
    the batch's."""
    found = []
    if layout.n_gpus != cluster.n_gpus:
        cp = f" x cp {layout.cp}" if layout.cp > 1 else ""
        found.append(f"dp {layout.dp}{cp} x tp {layout.tp} x pp {layout.pp} = {layout.n_gpus} "
                     f"GPUs, the cluster has {cluster.n_gpus}")
    model = replace(work.model, seq_len=work.seq_len)  # the rules read the trained length
    found += grid_problems(layout.grid, model, layout.run, where)
    if layout.cp > 1 and work.attention != "fused":
        found.append("context parallelism computes attention block by block with an online "
                     "softmax, as a fused kernel does: use attention 'fused'")
    if layout.tp > cluster.gpus_per_node:
        found.append(f"tp {layout.tp} is more than the {cluster.gpus_per_node} GPUs of a node: "
                     "tensor parallel's all-reduces would cross the slow network")
    if layout.zero_stage == 2 and layout.pp > 1:
        found.append("ZeRO-2 with pipelining: its sharded gradients would be reduce-scattered "
                     "at every micro-batch's backward; DeepSpeed refuses it (PipelineEngine: "
                     "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'): use "
                     "ZeRO-1")
    if layout.recompute == "selective" and work.attention == "fused":
        found.append("selective recomputation recomputes the attention scores, which the fused "
                     "kernel never stores: use recompute 'none' (or attention 'eager')")
    if layout.zero_stage and layout.replicas == 1:
        found.append("ZeRO shards over data-parallel ranks (dp x cp of them, context "
                     "parallel's included): it needs dp x cp > 1")
    per_step = layout.dp * layout.micro_batch * layout.micro_batches
    if per_step * work.seq_len != work.batch_tokens:
        found.append(f"dp {layout.dp} x micro-batch {layout.micro_batch} x "
                     f"{layout.micro_batches} micro-batches x {work.seq_len} tokens = "
                     f"{per_step * work.seq_len:,} tokens, not the batch's {work.batch_tokens:,}")
    if hasattr(work.model, "n_experts") and layout.recompute in ("selective", "op"):
        found.append(f"recompute {layout.recompute!r} is not counted for a mixture of experts "
                     "here (moe_estimate.py): use recompute 'none' or 'full'")
    if layout.recompute not in RECOMPUTE:
        found.append(f"recompute must be one of {RECOMPUTE}, got {layout.recompute!r}")
    return found


# Context parallel is tried for long sequences only: cp values leaving each rank at least this
# many tokens (GPT-3, Llama 2 and Llama 3's first stage trained 2-8K whole, without cp).
MIN_CP_TOKENS = 4096


def context_sizes(work, n_gpus):
    """cp values worth trying: 1, and the divisors of `n_gpus` that leave each rank at least
    MIN_CP_TOKENS of the sequence."""
    return [cp for cp in _divisors(n_gpus) if cp == 1 or work.seq_len // cp >= MIN_CP_TOKENS]


def check_ep(model, ep, n_gpus):
    """Refuse an ep no layout of `n_gpus` GPUs could use, with the rule book's sentence (ep
    divides the experts and the ranks it borrows; a dense model takes only ep 1)."""
    found = grid_problems(RankGrid(dp=n_gpus, ep=ep), model, Run(), "megatron")
    if found:  # the experts' rule first: its "try ep in" lists what the model can take
        raise ValueError(min(found, key=lambda p: "experts" not in p))


def expert_sizes(work, n_gpus):
    """ep values worth trying: 1 for a dense model; for an MoE, every divisor of its experts
    that divides `n_gpus` (the rule book drops those a layout's dp x cp x tp cannot lend)."""
    experts = getattr(work.model, "n_experts", None)
    return [1] if experts is None else [ep for ep in _divisors(experts) if n_gpus % ep == 0]


def layouts(work, cluster, micro_batch_sizes=(1, 2, 4, 8), zero_stages=(0, 1, 2, 3),
            recomputes=RECOMPUTE, interleaves=(1, 2, 4), contexts=None, where="megatron",
            experts=None):
    """Every valid layout of `work` on `cluster` over the given choices (`contexts`: the cp
    values; by default `context_sizes`; `experts`: the ep values, by default `expert_sizes`;
    `where`: whose rules, as `problems`)."""
    for ep in experts or expert_sizes(work, cluster.n_gpus):
        for layout in _grids(work, cluster, micro_batch_sizes, zero_stages, recomputes,
                             interleaves, contexts, where):
            if ep == 1:
                yield layout
                continue
            layout = replace(layout, ep=ep)
            if not problems(layout, work, cluster, where):
                yield layout


def _grids(work, cluster, micro_batch_sizes, zero_stages, recomputes, interleaves, contexts,
           where):
    n, B = cluster.n_gpus, work.sequences
    for cp in contexts or context_sizes(work, n):
        if n % cp:
            continue
        for tp in _divisors(n // cp):
            for pp in _divisors(n // cp // tp):
                dp = n // cp // tp // pp
                yield from _batch_splits(work, cluster, B, dp, tp, pp, cp, micro_batch_sizes,
                                         zero_stages, recomputes, interleaves, where)


def _batch_splits(work, cluster, B, dp, tp, pp, cp, micro_batch_sizes, zero_stages,
                  recomputes, interleaves, where):
    for mb in micro_batch_sizes:
        if B % (dp * mb):
            continue
        for zero in zero_stages:
            for recompute in recomputes:
                for v in interleaves:
                    layout = Layout(dp, tp, pp, zero, mb, B // (dp * mb), recompute, v, cp=cp)
                    if not problems(layout, work, cluster, where):
                        yield layout


def _divisors(n):
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))
