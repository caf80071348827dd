"""The rule book of a grid: what a model, a `RankGrid` and the way it runs must satisfy before
any process starts (lesson 07, `lessons/07_combining.ipynb`). The runtime (`GridPlan`,
`RankGrid.check_model`) and the planner (`dlcourse.planner.layouts.problems`) both call
`problems`, so a layout the planner ranks is one the runtime accepts, and what the runtime
refuses the planner refuses in the same sentence.

Each rule is a row of `RULES`: a name, where it comes from, whether it holds for every
framework ("megatron": Megatron-LM refuses it, or it cannot be cut at all) or only for this
course's runtime ("dlcourse": a combination the course does not build; the planner applies
those only when asked to, e.g. for layouts of the course GPT it will train), and a function
(grid, model, run) -> a sentence with the arithmetic, or None. `model` is any object with
`n_layers`, `n_heads`, `hidden`, `vocab_size`, `seq_len` (and `kv_heads`, `dropout` when it
has them): the course's `GPTConfig` or the planner's `ModelSpec`; None checks only the rules
that need no model.

Megatron-LM as read at commit d98e8a6 (2026-08-22):
- heads: megatron/core/transformer/transformer_config.py, `num_attention_heads` "must be a
  multiple of tensor_model_parallel_size"; `num_query_groups` (K/V heads) "must be a multiple
  or divisor" of it: with fewer K/V heads than tp ranks each K/V head is replicated on
  tp / kv_heads ranks;
- vocabulary: megatron/core/tokenizers/utils/build_tokenizer.py `vocab_size_with_padding`
  pads it up to a multiple of make_vocab_size_divisible_by (128) x tp (`padded_vocab`); the
  course's runtime does not pad, so it needs tp to divide it;
- whole layers: megatron/core/transformer/transformer_block.py asserts num_layers (+1 with
  `account_for_embedding_in_pipeline_split`, +1 with `..._loss_...`: Llama 3's lighter first
  and last stages) divisible by pp, and the layers of a pipeline rank divisible by vp_size:
  every virtual stage is a whole number of layers. With v = 1 the course (lesson 06's
  `stage_boundaries`) and DeepSpeed (BLOOM's 70 layers on 12 stages) accept uneven stages;
- interleaved 1F1B: megatron/core/pipeline_parallel/schedules.py asks the micro-batches
  grouped per virtual stage (`microbatch_group_size_per_vp_stage`, default pp) to lie in
  [pp, m] and m mod that group to be 0 or at least pp: with the default, m a multiple of pp;
- context parallel: megatron/training/arguments.py, "seq-length should be a multiple of 2 *
  context-parallel-size" (the zig-zag halves); sequence parallel splits the sequence over tp.

- experts: megatron/training/arguments.py, "Number of experts should be a multiple of expert
  model parallel_size" (and lesson 09's `check_ep`).

The expert axis (lesson 09; `RankGrid.ep`) borrows its ranks from dp x cp x tp, as torchtitan
does (pytorch/torchtitan b5bcd76, 2026-08-21, torchtitan/distributed/parallel_dims.py
`_validate`: "expert_parallel_degree must divide dp_shard * cp * tp"). A model "has experts" when
it has `n_experts` (the course's `MoEConfig`, the planner's `MoESpec`); ep > 1 on one without is
refused.
"""

import math
from dataclasses import dataclass
from typing import Callable

MEGATRON = "Megatron-LM d98e8a6 (2026-08-22)"
VOCAB_MULTIPLE = 128  # Megatron-LM's default --make-vocab-size-divisible-by


@dataclass(frozen=True)
class Run:
    """How a grid runs, beyond its sizes: what the rules need to know."""

    micro_batches: int = 1  # per data-parallel replica and step (the pipeline's m)
    zero_stage: int = 0  # 0: plain data parallel; 1, 2, 3: ZeRO on the dp (x cp) axis
    sequence_parallel: bool = False  # Korthikanti et al.'s sequence parallelism on tp
    light_ends: bool = False  # one layer fewer on the first and last stage (Llama 3)
    cp_method: str = "zigzag"  # lesson 08's way of passing K/V over cp
    recompute: str = "none"  # activation recomputation ("none" is all the grid here runs)


@dataclass(frozen=True)
class Rule:
    name: str
    where: str  # "megatron": holds everywhere; "dlcourse": this course's runtime only
    source: str
    broken: Callable  # (grid, model, run) -> a sentence, or None when the rule holds


def padded_vocab(vocab_size, tp, multiple=VOCAB_MULTIPLE):
    """Megatron-LM's padded vocabulary: up to a multiple of `multiple` x tp."""
    step = multiple * tp
    return math.ceil(vocab_size / step) * step


def _tp_divides(name):
    def broken(grid, model, run):
        value = getattr(model, name)
        if value % grid.tp:
            return (f"tp {grid.tp} does not divide {name} {value} ({value} / {grid.tp} = "
                    f"{value / grid.tp:g}): each tensor-parallel rank needs an equal share; "
                    f"try tp in {_divisors(_tp_limit(model))}")
        return None
    return broken


def _tp_limit(model):
    return math.gcd(model.n_heads, model.hidden, model.vocab_size)


def _kv_heads(grid, model, run):
    kv = getattr(model, "kv_heads", model.n_heads)
    if kv % grid.tp and grid.tp % kv:
        return (f"tp {grid.tp} and the {kv} K/V heads: neither divides the other ({kv} / "
                f"{grid.tp} = {kv / grid.tp:g}), so the K/V heads can be neither split nor "
                "replicated evenly over the tensor-parallel ranks")
    return None


def _stages(grid, model, run):
    if grid.pp > model.n_layers:
        return (f"pp {grid.pp} is more stages than the model's {model.n_layers} layers: every "
                "stage needs at least one block")
    return None


def _whole_virtual_stages(grid, model, run):
    chunks = grid.pp * grid.virtual
    slots = model.n_layers + (2 if run.light_ends else 0)
    if grid.virtual > 1 and slots % chunks:
        ends = " + 2 light-end slots" if run.light_ends else ""
        return (f"pp {grid.pp} x v {grid.virtual} = {chunks} virtual stages do not hold "
                f"{model.n_layers} layers{ends} whole ({slots} / {chunks} = "
                f"{slots / chunks:g} a stage): every virtual stage is a whole number of layers")
    return None


def _fill(grid, model, run):
    if grid.pp > 1 and run.micro_batches < grid.pp:
        return (f"{run.micro_batches} micro-batches cannot keep {grid.pp} stages busy: use at "
                f"least pp = {grid.pp}")
    return None


def _interleaved_micro_batches(grid, model, run):
    if grid.virtual > 1 and (grid.pp == 1 or run.micro_batches % grid.pp):
        return (f"interleaving (v {grid.virtual}) needs pp > 1 and micro-batches "
                f"({run.micro_batches}) a multiple of pp ({grid.pp})")
    return None


def _cp_sequence(grid, model, run):
    if grid.cp == 1:
        return None
    from dlcourse.parallel.context.parallelize import METHODS
    from dlcourse.parallel.context.layout import Layout
    try:  # lesson 08's own split: zig-zag needs 2 cp chunks, the ring cp
        Layout(METHODS[run.cp_method][0], grid.cp, model.seq_len)
    except ValueError as refused:
        return str(refused)
    return None


def _sp_sequence(grid, model, run):
    if run.sequence_parallel and grid.tp > 1 and model.seq_len % grid.tp:
        return (f"sequence parallelism: tp {grid.tp} does not divide seq_len {model.seq_len} "
                f"({model.seq_len} / {grid.tp} = {model.seq_len / grid.tp:g}); every rank "
                "holds an equal slice of the sequence")
    return None


def _ep_borrows(grid, model, run):
    region = grid.dp * grid.cp * grid.tp
    if region % grid.ep:
        return (f"ep {grid.ep} does not divide the dp {grid.dp} x cp {grid.cp} x tp {grid.tp} "
                f"= {region} ranks of a pipeline stage ({region} / {grid.ep} = "
                f"{region / grid.ep:g}): the expert-parallel ranks are borrowed from them; try "
                f"ep in {_divisors(region)}")
    return None


def _ep_divides_experts(grid, model, run):
    experts = getattr(model, "n_experts", None)
    if grid.ep > 1 and experts is None:
        return (f"ep {grid.ep} needs a mixture-of-experts model, and "
                f"{getattr(model, 'name', type(model).__name__)} has no experts: use ep 1")
    if grid.ep > 1 and experts % grid.ep:
        return (f"ep {grid.ep} does not divide the {experts} experts ({experts} / {grid.ep} = "
                f"{experts / grid.ep:g}): every rank holds E/ep whole experts; try ep in "
                f"{_divisors(experts)}")
    return None


def _not_built(test, sentence):
    """A combination the course's runtime does not build: `sentence` when test(grid, run)."""
    return lambda grid, model, run: sentence(grid, run) if test(grid, run) else None


COURSE = "dlcourse.parallel.combine (lesson 07): not built here"
RULES = [
    Rule("tp divides the heads", "megatron", f"{MEGATRON} transformer_config.py",
         _tp_divides("n_heads")),
    Rule("tp and the K/V heads", "megatron", f"{MEGATRON} transformer_config.py",
         _kv_heads),
    Rule("tp divides the width", "dlcourse", "the course's Megatron split of every matrix",
         _tp_divides("hidden")),
    Rule("tp divides the vocabulary", "dlcourse",
         f"the course does not pad; {MEGATRON} build_tokenizer.py pads to 128 x tp",
         _tp_divides("vocab_size")),
    Rule("a layer a stage at least", "megatron", "a stage of no layers has nothing to run",
         _stages),
    Rule("whole layers per virtual stage", "megatron", f"{MEGATRON} transformer_block.py",
         _whole_virtual_stages),
    Rule("micro-batches fill the pipeline", "megatron",
         "lesson 06: with m < pp a stage idles the whole step", _fill),
    Rule("interleaved micro-batches", "megatron", f"{MEGATRON} pipeline_parallel/schedules.py",
         _interleaved_micro_batches),
    Rule("cp splits the sequence", "megatron", f"{MEGATRON} arguments.py; lesson 08's Layout",
         _cp_sequence),
    Rule("sp splits the sequence", "megatron", "Korthikanti et al. 2022 §4.2.2", _sp_sequence),
    Rule("ep divides the experts", "megatron", f"{MEGATRON} arguments.py; lesson 09's check_ep",
         _ep_divides_experts),
]
TORCHTITAN = "torchtitan b5bcd76 (2026-08-21) distributed/parallel_dims.py"
GRID_RULES = [  # the rules that need no model
    Rule("ep borrows dp x cp x tp ranks", "megatron", TORCHTITAN, _ep_borrows),
    Rule("ZeRO with pp", "dlcourse", COURSE, _not_built(
        lambda g, r: r.zero_stage and g.pp > 1,
        lambda g, r: (f"ZeRO stage {r.zero_stage} with pp {g.pp} is not built here: ZeRO "
                      "takes over the gradients, which the pipeline's executor reads stage by "
                      "stage, and stages 2 and 3 would reduce-scatter after each of the m "
                      "micro-batches (DeepSpeed's pipeline refuses them too). Use zero_stage=0 "
                      "with pp > 1, or pp=1"))),
    Rule("sequence parallel with pp", "dlcourse", COURSE, _not_built(
        lambda g, r: r.sequence_parallel and g.pp > 1,
        lambda g, r: ("sequence_parallel with pp > 1 is not built here: stages would pass "
                      "(b, T/tp, h) sequence shards, and lesson 06's executor sends whole "
                      "(b, T, h) activations. Use sequence_parallel=False with pp > 1"))),
    Rule("cp with pp", "dlcourse", COURSE, _not_built(
        lambda g, r: g.cp > 1 and g.pp > 1,
        lambda g, r: (f"cp {g.cp} with pp {g.pp} is not built here: lesson 06's stages are "
                      "cut from the plain GPT and pass whole (b, T, h) activations. Use pp=1 "
                      "with cp > 1"))),
    Rule("cp with sequence parallel", "dlcourse", COURSE, _not_built(
        lambda g, r: g.cp > 1 and r.sequence_parallel,
        lambda g, r: (f"cp {g.cp} with sequence_parallel is not built here: lesson 04's "
                      "sequence shards would cut each rank's s/cp tokens again, with positions "
                      "of their own. Use sequence_parallel=False with cp > 1"))),
    Rule("interleaving in the grid", "dlcourse", COURSE, _not_built(
        lambda g, r: g.virtual > 1,
        lambda g, r: (f"v {g.virtual} virtual stages a rank is not built in the combined grid "
                      "here: lesson 06 runs interleaved 1F1B alone; use v = 1"))),
    Rule("accumulation in the grid", "dlcourse", COURSE, _not_built(
        lambda g, r: g.pp == 1 and r.micro_batches != 1,
        lambda g, r: (f"micro_batches {r.micro_batches} only cut the batch for a pipeline "
                      "(pp > 1); with pp = 1 use micro_batches=1"))),
    Rule("recomputation in the grid", "dlcourse", COURSE, _not_built(
        lambda g, r: r.recompute != "none",
        lambda g, r: (f"recompute {r.recompute!r} is not built in the combined grid here "
                      "(lesson 01 measures it on one process): use recompute 'none'"))),
    Rule("experts in the grid", "dlcourse", COURSE, _not_built(
        lambda g, r: g.ep > 1,
        lambda g, r: (f"ep {g.ep} is not built in the combined grid here: lesson 09's "
                      "expert_parallel runs experts over data-parallel ranks alone; use ep 1 "
                      "in the grid"))),
    Rule("light ends in the grid", "dlcourse", COURSE, _not_built(
        lambda g, r: r.light_ends,
        lambda g, r: ("light first and last stages are not built here: lesson 06's "
                      "stage_boundaries cuts the layers as evenly as they go"))),
]


def problems(grid, model=None, run=Run(), where="dlcourse"):
    """Every rule `grid` running `run` breaks for `model`, each a sentence with the arithmetic;
    [] when it can be built. where="megatron": only the rules that hold everywhere;
    "dlcourse": those and what this course's runtime does not build."""
    if where not in ("megatron", "dlcourse"):
        raise ValueError(f"where must be 'megatron' or 'dlcourse', got {where!r}")
    rows = GRID_RULES + (RULES if model is not None else [])
    found = []
    for rule in rows:
        if rule.where == "dlcourse" and where != "dlcourse":
            continue
        sentence = rule.broken(grid, model, run)
        if sentence and sentence not in found:
            found.append(sentence)
    return found


def refuse(grid, model=None, run=Run(), where="dlcourse"):
    """Raise the first of `problems` as a ValueError (the runtime's way), or return."""
    found = problems(grid, model, run, where)
    if found:
        raise ValueError(found[0])


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]
