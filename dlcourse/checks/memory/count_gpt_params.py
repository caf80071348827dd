"""Lesson 01, exercise 1 (`exercises/01_memory.ipynb`): `check_count_params`, Ψ of the course GPT
counted from its config alone, compared with the real model's sum(p.numel()); a wrong count is
named by the piece of the model it is off by.
"""

from dataclasses import replace

from dlcourse.checks.core import fail, fresh_cases
from dlcourse.checks.memory.calls import answer, expect_number, num
from dlcourse.memory import count_params, param_shapes, spec_params
from dlcourse.models import GPT, GPTConfig


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
        got = answer(count_gpt_params, (config,), exercise="count_gpt_params", where=where,
                     forbidden=(count_params, param_shapes, spec_params),
                     why="count Ψ from the config yourself, as you would for a model too big "
                         "to build")
        expect_number(got, where=where, unit="parameters", hint=COUNT_HINT)
        if got != expected:
            off = got - expected
            fail(where, None, f"returned {num(got)} parameters, the model has {num(expected)}: "
                              f"{num(abs(off))} too {'many' if off > 0 else 'few'}",
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
            return f"{num(abs(off))} is exactly {what}: {advice}"
    return COUNT_HINT


def _describe_config(config):
    fields = ("vocab_size", "seq_len", "n_layers", "n_heads", "hidden", "bias", "tie_embeddings")
    return f"GPTConfig({', '.join(f'{f}={getattr(config, f)}' for f in fields)})"
