"""Check for lesson 07's exercise on the rule book: given a model and a grid, which rules it
breaks (exported by `__init__.py`).

    check_broken_rules(broken_rules)

broken_rules(model, grid, micro_batches) takes plain dicts, model {"n_layers", "n_heads",
"kv_heads", "hidden", "vocab_size", "seq_len"} and grid {"dp", "cp", "tp", "pp", "v"}, and
returns the names (any iterable) of the rules in `RULE_NAMES` it breaks. The reference is the
runtime's own rule book (`dlcourse.parallel.rules.RULES`, the rules every framework has), asked
about a `RankGrid` of the same sizes; the rule book and the grid are refused while the student's
function runs (`answers.py`). Cases are drawn afresh each run, and among them always: K/V heads
fewer than tp ranks (replicated, not broken), stages of uneven layers without interleaving (not
broken), a sequence that cp divides but 2 cp does not (broken), and a grid that breaks nothing.
"""

from types import SimpleNamespace

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.rules import RULES, Run

RULE_NAMES = ("tp divides the heads", "tp and the K/V heads", "a layer a stage at least",
              "whole layers per virtual stage", "micro-batches fill the pipeline",
              "interleaved micro-batches", "cp splits the sequence")
HINTS = {
    "tp divides the heads": "each tp rank takes n_heads / tp whole heads",
    "tp and the K/V heads": "K/V heads are split when tp divides them and replicated when they "
                            "divide tp: broken only when neither divides the other",
    "a layer a stage at least": "pp stages need at least pp layers",
    "whole layers per virtual stage": "with v > 1 every one of the pp x v virtual stages holds "
                                      "whole layers: n_layers % (pp v); with v = 1 stages may "
                                      "differ by a layer",
    "micro-batches fill the pipeline": "with pp > 1 there must be at least pp micro-batches",
    "interleaved micro-batches": "interleaving (v > 1) needs pp > 1 and micro-batches a "
                                 "multiple of pp (Megatron-LM's default group of pp)",
    "cp splits the sequence": "the zig-zag split cuts each sequence into 2 cp equal chunks",
}
TELLING = [  # (model, grid, micro_batches) each run includes, beside the random draws
    (dict(n_layers=32, n_heads=32, kv_heads=4, hidden=4096, vocab_size=32000, seq_len=4096),
     dict(dp=2, cp=1, tp=8, pp=1, v=1), 1),  # 4 K/V heads on 8 ranks: replicated, fine
    (dict(n_layers=30, n_heads=16, kv_heads=16, hidden=2048, vocab_size=50257, seq_len=2048),
     dict(dp=1, cp=1, tp=2, pp=4, v=1), 8),  # 30 layers on 4 stages, uneven: fine
    (dict(n_layers=24, n_heads=16, kv_heads=8, hidden=2048, vocab_size=32000, seq_len=6148),
     dict(dp=1, cp=4, tp=2, pp=1, v=1), 1),  # 6148 = 4 x 1537, not 8 x a whole chunk: broken
    (dict(n_layers=32, n_heads=32, kv_heads=8, hidden=4096, vocab_size=32000, seq_len=4096),
     dict(dp=2, cp=2, tp=4, pp=4, v=2), 8),  # nothing broken
]


def reference_broken(model, grid, micro_batches):
    """The names of the rules the runtime's rule book finds broken, in `RULE_NAMES`' order."""
    g = RankGrid(dp=grid["dp"], cp=grid["cp"], tp=grid["tp"], pp=grid["pp"], virtual=grid["v"])
    shape, run = SimpleNamespace(**model), Run(micro_batches=micro_batches)
    return [r.name for r in RULES if r.name in RULE_NAMES and r.broken(g, shape, run)]


def draw_case(rng):
    """A model and a grid with sizes near the rules' edges."""
    heads = rng.choice((8, 12, 16, 32, 40, 64))
    kv = rng.choice([d for d in (1, 2, 4, 8, heads) if heads % d == 0])
    model = dict(n_layers=rng.choice((12, 24, 30, 32, 40, 48, 80, 126)), n_heads=heads,
                 kv_heads=kv, hidden=heads * 128, vocab_size=rng.choice((32000, 50257, 128256)),
                 seq_len=rng.choice((2048, 4096, 6144, 8192, 8200)))
    pp = rng.choice((1, 1, 2, 3, 4, 8, 16))
    grid = dict(dp=rng.choice((1, 2, 8)), cp=rng.choice((1, 1, 2, 3, 4, 8)),
                tp=rng.choice((1, 2, 3, 4, 8, 16)), pp=pp, v=rng.choice((1, 1, 2, 3, 4)))
    return model, grid, rng.choice((1, 2, 3, pp, 2 * pp, 3 * pp + 1, 64))


@fresh_cases
def check_broken_rules(broken_rules, *, rng):
    """broken_rules(model, grid, micro_batches) must return the names of the rules broken."""
    __tracebackhide__ = True
    expect_callable(broken_rules, "broken_rules")
    cases = TELLING + [draw_case(rng) for _ in range(40)]
    rng.shuffle(cases)
    for model, grid, m in cases:
        where = f"broken_rules({model}, {grid}, micro_batches={m})"
        got = call_in_process(broken_rules, (dict(model), dict(grid), m), exercise="broken_rules",
                              where=where, guard=ANSWERS.in_process, hint="")
        if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
            fail(where, None, f"returned {kind(got)}, expected the names of the broken rules",
                 "return a set or list of names from RULE_NAMES, empty when none is broken")
        got = set(got)
        want = set(reference_broken(model, grid, m))
        if got != want:
            missing, extra = sorted(want - got), sorted(got - want)
            said = "; ".join(([f"missed {missing}"] if missing else [])
                             + ([f"named {extra}, which hold"] if extra else []))
            fail(where, None, f"{said} (expected {sorted(want) or 'none'})",
                 HINTS.get((missing or extra)[0], "use the names in RULE_NAMES"))
    print(f"broken_rules: passed on {len(cases)} grids (K/V heads replicated, uneven stages, "
          "the zig-zag's 2 cp chunks, grids that break nothing)")
