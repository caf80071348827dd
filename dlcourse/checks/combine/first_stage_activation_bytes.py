"""Check for lesson 07's exercise on the pipeline's memory (exported by `__init__.py`, where the
grader cells find it): the activation bytes the first pipeline rank holds at its peak, under
1F1B and under interleaved 1F1B.

    check_first_stage_activation_bytes(first_stage_activation_bytes)

The reference is lesson 06's own count, not a formula: `in_flight_peak` walked over the first
rank's action list from lesson 06's `one_f_one_b` / `interleaved_1f1b`, each (virtual) stage's
micro-batch costing its layers' bytes. Lesson 06 measured that count equal, to the byte, to
the activations a real run holds (SavedTensorLog on real ranks). It is computed before the
student's function runs; while it runs, those functions and the planner are refused
(`answers.py`). Cases are drawn afresh: p from 2 to 8, v = 1 (with fewer
micro-batches than stages too) and v = 2, 3, 4, so that interleaving's factor at v = 1, a chunk
counted as a whole stage, or m < p forgotten each fail with a hint that names it.
"""

import math
import numbers

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.parallel.pipeline.measure import in_flight_peak
from dlcourse.parallel.pipeline.schedules import interleaved_1f1b, one_f_one_b

CASES = 8
HINT = ("lesson 06: the first rank runs p - 1 warm-up forwards, then one more before its first "
        "backward (1F1B), so it holds min(m, p) micro-batches of its L/p layers; interleaved, "
        "its warm-up is 2(p - 1) + (v - 1)p forwards of chunks of L/(p v) layers")


def reference_bytes(layer_bytes, n_layers, p, m, v):
    """Lesson 06's count: the most bytes the first rank's action list holds at once."""
    chunk = n_layers // (p * v) * layer_bytes  # one micro-batch through one chunk of layers
    actions = one_f_one_b(0, p, m) if v == 1 else interleaved_1f1b(0, p, m, v)
    return in_flight_peak(actions, {stage: chunk for stage in range(p * v)})


def draw_case(rng, v, few=False):
    """(layer_bytes, n_layers, p, m, v): with `few` (1F1B only), fewer micro-batches than
    stages; else m a multiple of p (interleaving's rule); layers a multiple of p v."""
    p = rng.randint(2, 8)
    m = rng.randint(1, p - 1) if few else p * rng.randint(1, 4)
    n_layers = p * v * rng.randint(1, 4)
    return rng.randrange(10**6, 10**9), n_layers, p, m, v


@fresh_cases
def check_first_stage_activation_bytes(first_stage_activation_bytes, *, rng):
    """first_stage_activation_bytes(layer_bytes, n_layers, p, m, v) must return the most
    activation bytes the first pipeline rank holds at once (1F1B if v = 1, else interleaved)."""
    __tracebackhide__ = True
    expect_callable(first_stage_activation_bytes, "first_stage_activation_bytes")
    vs = [1, 2, 1, 2] + [rng.choice((1, 2, 3, 4)) for _ in range(CASES - 4)]
    for i, v in enumerate(vs):
        args = draw_case(rng, v, few=i == 2)  # the second 1F1B case: m < p
        want = reference_bytes(*args)  # before the guard: it uses lesson 06's functions
        where = ("first_stage_activation_bytes(layer_bytes={:,}, n_layers={}, p={}, m={}, "
                 "v={})".format(*args))
        got = call_in_process(first_stage_activation_bytes, args,
                              exercise="first_stage_activation_bytes", where=where,
                              guard=ANSWERS.in_process, hint=HINT)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of bytes", HINT)
        if not math.isclose(got, want, rel_tol=1e-9):  # the same count, in another order
            fail(where, None, f"returned {got:,.0f} bytes, expected {want:,} (lesson 06's "
                              "in_flight_peak over its schedule)", _hint(got, *args))
    print(f"first_stage_activation_bytes: passed on {len(vs)} cases (1F1B with m below and "
          "above p, interleaved with v = 2 to 4)")


def _hint(got, layer_bytes, n_layers, p, m, v):
    """Name the mistake by what the answer equals."""
    stage = n_layers // p * layer_bytes  # one micro-batch through a whole stage
    if v == 1 and math.isclose(got, p * (1 + (p - 1) / p) * stage, rel_tol=1e-9):
        return ("that is interleaving's factor (1 + (p - 1)/(p v)) at v = 1: plain 1F1B's first "
                "stage holds p micro-batches, no more (lesson 06 measured it)")
    if v == 1 and m < p and math.isclose(got, p * stage, rel_tol=1e-9):
        return (f"with m = {m} micro-batches, fewer than p = {p}, the warm-up ends early: the "
                "first stage can never hold more micro-batches than there are")
    if v > 1 and math.isclose(got, v * reference_bytes(layer_bytes, n_layers, p, m, v),
                              rel_tol=1e-9):
        return (f"an interleaved chunk holds 1/v of a stage's layers ({n_layers // (p * v)} "
                "here), not a whole stage")
    if v > 1 and math.isclose(got, p * stage, rel_tol=1e-9):
        return ("that is plain 1F1B's count: interleaving's warm-up is longer, "
                "2(p - 1) + (v - 1)p forwards, so it holds more, not less")
    return HINT
