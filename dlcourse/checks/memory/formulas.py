"""Lesson 01's three formula checks, run in this process (the set's guide is `__init__.py`)."""

import functools
import numbers
from collections.abc import Mapping
from dataclasses import replace

import torch

from dlcourse.checks.memory.answers import ANSWERS
from dlcourse.checks.memory.in_rank import no_modules
from dlcourse.checks.core import call_in_process, fail, fresh_cases
from dlcourse.memory import (MemoryParts, SavedTensorLog, count_params, estimate_gpt_step,
                             gpt_saved_tensors, measure_step, model_state_bytes, param_shapes,
                             spec_params)
from dlcourse.models import GPT, GPTConfig, MLPBlock

# ---------------------------------------------------------------- calling the student's function


def _answer(fn, args, *, exercise, where, forbidden=(), why=""):
    """fn(*args), with building a module, each of `forbidden` and this module's own functions
    refused while it runs (`core/answers.py`); any error it raises becomes a CheckFailed that names
    the case."""
    __tracebackhide__ = True
    answers = ANSWERS.but(single=tuple(("dlcourse.memory", f.__name__) for f in forbidden),
                          also=(functools.partial(no_modules, why),), why=why)
    return call_in_process(fn, args, exercise=exercise, where=where, guard=answers.in_process)


def _expect_number(got, *, where, unit, hint=""):
    """Fail unless `got` is a plain number (int or float, not a bool, a tensor or None)."""
    __tracebackhide__ = True
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(where, None, f"returned {_kind(got)}, expected a number of {unit}", hint)


# ---------------------------------------------------------------- exercise 1: Ψ of the course GPT

# Odd sizes, and every combination of GPT-2's two choices: biases (Linear and LayerNorm) and an
# output layer tied to the token embedding. The notebook's formula covers only the first case.
COUNT_CASES = [
    GPTConfig(vocab_size=37, seq_len=11, n_layers=3, n_heads=3, hidden=24),
    GPTConfig(vocab_size=50, seq_len=7, n_layers=2, n_heads=2, hidden=20, bias=False),
    GPTConfig(vocab_size=29, seq_len=13, n_layers=1, n_heads=4, hidden=16, tie_embeddings=False),
    GPTConfig(vocab_size=101, seq_len=5, n_layers=4, n_heads=1, hidden=12, bias=False,
              tie_embeddings=False),
]

# Pieces of the GPT that a wrong count is often off by exactly: (what, which parameters by
# name, what students get wrong about it).
PIECES = [
    ("the output layer's (V, h) weight", lambda n: n == "lm_head.weight",
     "with tie_embeddings=True, lm_head.weight IS tok_emb.weight: one matrix, counted once; with "
     "tie_embeddings=False the output layer has a (V, h) weight of its own (and no bias)"),
    ("the position embedding", lambda n: n.startswith("pos_emb"),
     "GPT-2 learns one h-vector per position, seq_len of them"),
    ("every bias", lambda n: n.endswith(".bias"),
     "bias=True gives every Linear and every LayerNorm a bias; bias=False removes them all"),
    ("the Linear layers' biases", lambda n: n.endswith(".bias") and ".ln" not in n
     and not n.startswith("ln_f"),
     "a Linear has one bias per output: qkv 3h, proj h, fc 4h, proj h in every block"),
    ("the LayerNorm parameters", lambda n: ".ln" in n or n.startswith("ln_f"),
     "ln1 and ln2 in every block and ln_f after the last: a scale of h each, and a bias of h "
     "when bias=True"),
    ("the LayerNorm scales, or their biases", lambda n: (".ln" in n or n.startswith("ln_f"))
     and n.endswith(".weight"),
     "every LayerNorm (ln1, ln2 in each block, ln_f) has a scale of h, and a bias of h when "
     "bias=True; bias=False removes the bias, the scale stays"),
    ("the final LayerNorm, ln_f", lambda n: n.startswith("ln_f"),
     "after the last block, ln_f normalises once more before the output layer"),
]

COUNT_HINT = ("print the parameters of a tiny model, `for n, p in GPT(GPTConfig(n_layers=1, "
              "hidden=8, n_heads=1)).named_parameters(): print(n, tuple(p.shape))`, with bias and "
              "tie_embeddings both ways, and count each from the config")


@fresh_cases
def check_count_params(count_gpt_params, *, rng):
    """count_gpt_params(config) must return Ψ of GPT(config) exactly, for any GPTConfig, counted
    from the config alone (no model built, no dlcourse.memory.count_params)."""
    __tracebackhide__ = True
    cases = COUNT_CASES + [_drawn_config(rng) for _ in range(2)]
    for config in cases:
        expected = sum(p.numel() for p in GPT(config).parameters())  # a tied weight: once
        where = f"count_gpt_params({_describe_config(config)})"
        got = _answer(count_gpt_params, (config,), exercise="count_gpt_params", where=where,
                      forbidden=(count_params, param_shapes, spec_params),
                      why="count Ψ from the config yourself, as you would for a model too big "
                          "to build")
        _expect_number(got, where=where, unit="parameters", hint=COUNT_HINT)
        if got != expected:
            off = got - expected
            fail(where, None, f"returned {_num(got)} parameters, the model has {_num(expected)}: "
                              f"{_num(abs(off))} too {'many' if off > 0 else 'few'}",
                 _count_hint(config, off))
    print(f"count_gpt_params: passed on {len(cases)} configs (biases and tied output "
          "layer both ways), each equal to the real model's sum(p.numel())")


def _drawn_config(rng):
    """A GPTConfig of random small sizes, biases and tying drawn too."""
    heads = rng.randint(1, 4)
    return GPTConfig(vocab_size=rng.randint(5, 120), seq_len=rng.randint(2, 16),
                     n_layers=rng.randint(1, 4), n_heads=heads, hidden=heads * rng.randint(2, 8),
                     bias=rng.random() < 0.5, tie_embeddings=rng.random() < 0.5)


def _count_hint(config, off):
    """Name the piece of the model a count is off by, if it is exactly one of PIECES. Sizes come
    from the same shapes with every piece present: a piece this config lacks is one a wrong
    count may have added."""
    full = GPT(replace(config, bias=True, tie_embeddings=False))
    numel = {name: p.numel() for name, p in full.named_parameters()}
    for what, chosen, advice in PIECES:
        if abs(off) == sum(n for name, n in numel.items() if chosen(name)):
            return f"{_num(abs(off))} is exactly {what}: {advice}"
    return COUNT_HINT


def _describe_config(config):
    fields = ("vocab_size", "seq_len", "n_layers", "n_heads", "hidden", "bias", "tie_embeddings")
    return f"GPTConfig({', '.join(f'{f}={getattr(config, f)}' for f in fields)})"


# ---------------------------------------------------------------- exercise 2: ZeRO per rank

# (n_params, dp, zero_stage, mixed_precision): every stage, both precisions, Ψ that N_d does
# not divide, a single rank, and real sizes (GPT-2 XL, Llama-2 7B).
ZERO_CASES = [
    (1_000_003, 3, 1, True),
    (354_823_168, 8, 2, True),
    (1_557_611_200, 16, 3, True),
    (123_456_789, 5, 0, True),
    (6_738_415_616, 64, 1, False),
    (2_000_001, 7, 3, False),
    (10_000_019, 4, 2, False),
    (50_000_017, 1, 2, True),
]
PARTS = ("params", "grads", "optimizer")

# Ψ/N_d is rarely whole. A real rank keeps a whole number of parameters (ZeRO pads Ψ to a
# multiple of N_d), so exact, floor and ceiling division are all right: they differ by less than
# one parameter's bytes of a part, at most K = 12. A wrong answer is off by Ψ/N_d bytes or more
# (here at least 285,714), so the tolerance hides no mistake.
ZERO_TOLERANCE_BYTES = 12

ZERO_HINT = ("bytes per parameter: mixed precision keeps 2 (fp16 weights) + 2 (fp16 gradients) "
             "+ K = 12 (fp32 master weights, Adam's momentum and variance); plain fp32 keeps "
             "4 + 4 + K = 8 (no master copy: the weights are fp32 already). Stage 1 divides the "
             "optimizer state by N_d, stage 2 the gradients too, stage 3 the parameters too")


@fresh_cases
def check_zero_model_state(zero_model_state, *, rng):
    """zero_model_state(n_params, dp, zero_stage, mixed_precision) must return the bytes one of
    dp ranks keeps, {"params": ..., "grads": ..., "optimizer": ...}, by ZeRO's accounting."""
    __tracebackhide__ = True
    cases = ZERO_CASES + [(rng.randint(10**5, 10**10), rng.randint(2, 128), stage,
                           rng.random() < 0.5) for stage in range(4)]
    for n_params, dp, stage, mixed in cases:
        where = (f"zero_model_state(n_params={n_params:,}, dp={dp}, zero_stage={stage}, "
                 f"mixed_precision={mixed})")
        got = _answer(zero_model_state, (n_params, dp, stage, mixed), exercise="zero_model_state",
                      where=where, forbidden=(model_state_bytes,),
                      why="write ZeRO's accounting yourself; the lesson's function is its answer")
        got = _as_parts(got, where)
        expected = model_state_bytes(n_params, dp=dp, zero_stage=stage, mixed_precision=mixed)
        for part in PARTS:
            want = getattr(expected, part)
            _expect_number(got[part], where=where, unit=f"bytes for {part!r}", hint=ZERO_HINT)
            if abs(got[part] - want) > ZERO_TOLERANCE_BYTES:
                fail(where, None, f"{part} is {_num(got[part])} bytes per rank, expected "
                                  f"{_num(want)}", _zero_hint(part, got[part], want, dp, stage))
    print(f"zero_model_state: passed on {len(cases)} cases (stages 0-3, mixed precision "
          "and fp32, 1 to 64 ranks)")


def _as_parts(got, where):
    __tracebackhide__ = True
    if isinstance(got, MemoryParts):
        got = got.as_dict()
    if not isinstance(got, Mapping):
        fail(where, None, f"returned {_kind(got)}, expected a dict with the keys 'params', "
                          "'grads' and 'optimizer'", "return {'params': ..., 'grads': ..., "
                          "'optimizer': ...}, the bytes one rank keeps of each part")
    missing = [part for part in PARTS if part not in got]
    if missing:
        fail(where, None, f"returned a dict without {', '.join(map(repr, missing))}; expected "
                          "the keys 'params', 'grads' and 'optimizer' (bytes per rank)")
    return got


def _zero_hint(part, got, want, dp, stage):
    """Say which way a part is off: kept whole when the stage partitions it, or the reverse."""
    partitioned = {"optimizer": 1, "grads": 2, "params": 3}[part] <= stage
    what = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}[part]
    if partitioned and dp > 1 and abs(got - want * dp) <= ZERO_TOLERANCE_BYTES * dp:
        return (f"that is N_d = {dp} times too much: stage {stage} partitions the {what}, so "
                "each rank keeps 1/N_d of it")
    if not partitioned and dp > 1 and abs(got - want / dp) <= ZERO_TOLERANCE_BYTES:
        return (f"that is 1/N_d of it: stage {stage} does not partition the {what}, so every "
                "rank keeps all of it" + ("" if stage else " (stage 0 is plain data parallel)"))
    return ZERO_HINT + (f", by N_d = {dp} here" if partitioned else "")


# ---------------------------------------------------------------- exercise 3: MLP activations

# (batch, seq_len, hidden, dropout, dtype): odd shapes, dropout off and on, three dtypes.
MLP_CASES = [
    (3, 5, 24, 0.1, torch.float32),
    (2, 7, 12, 0.0, torch.float32),
    (1, 9, 20, 0.25, torch.bfloat16),
    (5, 3, 8, 0.5, torch.float64),
]

MLP_HINT = ("for each op of h -> fc -> GELU -> proj -> dropout, ask what its backward needs: a "
            "Linear its input (for the weight's gradient), GELU its input, dropout its mask when "
            "dropout > 0 (on CPU a tensor of the activations' dtype). To see them, in a cell of "
            "your own as in lesson 01: `with SavedTensorLog(mlp) as log: out = mlp(x)`, then "
            "print `log.records`")


@fresh_cases
def check_mlp_activations(mlp_activation_bytes, *, rng):
    """mlp_activation_bytes(batch, seq_len, hidden, dropout, dtype) must return the bytes of the
    tensors the course GPT's MLP block (`dlcourse.models.MLPBlock`), in `dtype` on CPU, saves
    for backward in training mode: what SavedTensorLog measures."""
    __tracebackhide__ = True
    drawn = (rng.randint(1, 6), rng.randint(1, 12), rng.randint(2, 32), rng.choice((0.0, 0.2)),
             rng.choice((torch.float32, torch.float64, torch.bfloat16)))
    cases = MLP_CASES + [drawn]
    for batch, seq_len, hidden, dropout, dtype in cases:
        args = (batch, seq_len, hidden, dropout, dtype)
        where = (f"mlp_activation_bytes(batch={batch}, seq_len={seq_len}, hidden={hidden}, "
                 f"dropout={dropout}, dtype={dtype})")
        got = _answer(mlp_activation_bytes, args, exercise="mlp_activation_bytes", where=where,
                      forbidden=(SavedTensorLog, measure_step, gpt_saved_tensors,
                                 estimate_gpt_step),
                      why="predict the bytes from the shapes; measuring them is the check's job")
        _expect_number(got, where=where, unit="bytes", hint=MLP_HINT)
        expected = _measure_mlp_block(*args)
        if got != expected:
            unit = batch * seq_len * hidden * dtype.itemsize  # one (B, T, h) tensor in dtype
            fail(where, None, f"returned {_num(got)} bytes, the block saved {_num(expected)}",
                 f"counted in (B, T, h) tensors of {dtype.itemsize}-byte values, yours is "
                 f"{got / unit:g} of them, the block's {expected / unit:g}; {MLP_HINT}")
    print(f"mlp_activation_bytes: passed on {len(cases)} shapes (dropout on and off; "
          "float32, bfloat16, float64), each equal to a SavedTensorLog measurement")


def _measure_mlp_block(batch, seq_len, hidden, dropout, dtype):
    """Bytes the real block saves for backward, as lesson 01 measures them."""
    config = GPTConfig(hidden=hidden, n_heads=1, dropout=dropout)
    block = MLPBlock(config).to(dtype)  # a new module is in training mode: dropout is on
    x = torch.randn(batch, seq_len, hidden, dtype=dtype, requires_grad=True)  # (B, T, h)
    with SavedTensorLog(block) as log:
        out = block(x)  # noqa: F841 (the graph behind `out` holds the saved tensors: keep it)
    # x counts: fc saves it for its weight's gradient, as Korthikanti et al. count it.
    return log.live_bytes()["activations"]


def _kind(value):
    return "None" if value is None else f"a value of type {type(value).__name__}"


def _num(x):
    """12,345 for whole numbers, 12,345.67 otherwise: how the messages print bytes and counts."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"
