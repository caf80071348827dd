"""Lesson 01, exercise 2 (`exercises/01_memory.ipynb`): `check_zero_model_state`, the bytes of
parameters, gradients and optimizer state one ZeRO rank keeps, compared with ZeRO's accounting
(`dlcourse.memory.model_state_bytes`, refused while the student's function runs).
"""

from collections.abc import Mapping

from dlcourse.checks.core import fail, fresh_cases
from dlcourse.checks.memory.calls import answer, expect_number, kind_of, num
from dlcourse.memory import MemoryParts, model_state_bytes


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
        got = answer(zero_model_state, (n_params, dp, stage, mixed), exercise="zero_model_state",
                     where=where, forbidden=(model_state_bytes,),
                     why="write ZeRO's accounting yourself; the lesson's function is its answer")
        got = _as_parts(got, where)
        expected = model_state_bytes(n_params, dp=dp, zero_stage=stage, mixed_precision=mixed)
        for part in PARTS:
            want = getattr(expected, part)
            expect_number(got[part], where=where, unit=f"bytes for {part!r}", hint=ZERO_HINT)
            if abs(got[part] - want) > ZERO_TOLERANCE_BYTES:
                fail(where, None, f"{part} is {num(got[part])} bytes per rank, expected "
                                  f"{num(want)}", _zero_hint(part, got[part], want, dp, stage))
    print(f"zero_model_state: passed on {len(cases)} cases (stages 0-3, mixed precision "
          "and fp32, 1 to 64 ranks)")


def _as_parts(got, where):
    __tracebackhide__ = True
    if isinstance(got, MemoryParts):
        got = got.as_dict()
    if not isinstance(got, Mapping):
        fail(where, None, f"returned {kind_of(got)}, expected a dict with the keys 'params', "
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
