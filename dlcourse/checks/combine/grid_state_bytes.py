"""Lesson 07, exercise 4 (`exercises/07_combining.ipynb`): `check_grid_state_bytes`, the
model-state bytes of one rank of a grid with ZeRO on dp. Cases are drawn afresh on every run:
dp, tp and pp from 1 to 64 (all different, so a division on the wrong axis shows), ZeRO stages
0-3 in both precisions. The reference is the arithmetic written out here; lesson 01's
`model_state_bytes` and the planner are refused while the student's function runs
(`answers.py`).
"""

import math
import numbers

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind


STATE_HINT = ("tp and pp each cut the parameters: a rank holds Ψ / (tp pp) of them; ZeRO then "
              "divides the parts its stage partitions by dp, the replicas of that piece")
PER_PARAMETER = {True: (2, 2, 12), False: (4, 4, 8)}  # (parameters, gradients, optimizer state)


def reference_state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision):
    """Bytes one rank holds: its 1/(tp pp) piece, each part divided by dp if partitioned."""
    piece = n_params / (tp * pp)
    parts = zip(("params", "grads", "optimizer"), PER_PARAMETER[mixed_precision])
    partitioned = ("optimizer", "grads", "params")[:zero_stage]
    return sum(b * piece / (dp if part in partitioned else 1) for part, b in parts)


@fresh_cases
def check_grid_state_bytes(grid_state_bytes, *, rng):
    """grid_state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision) must return the
    model-state bytes of one rank (Ψ / N formulas, no padding)."""
    __tracebackhide__ = True
    expect_callable(grid_state_bytes, "grid_state_bytes")
    cases = [(z, mixed) for z in range(4) for mixed in (True, False)]
    rng.shuffle(cases)
    for zero, mixed in cases:
        while True:
            sizes = [rng.choice((1, 2, 3, 4, 8, 16, 64)) for _ in range(3)]  # dp, tp, pp
            if _telling(sizes, zero):
                break
        args = (rng.randrange(10**6, 10**11), *sizes, zero, mixed)
        where = ("grid_state_bytes(n_params={:,}, dp={}, tp={}, pp={}, zero_stage={}, "
                 "mixed_precision={})".format(*args))
        got = call_in_process(grid_state_bytes, args, exercise="grid_state_bytes", where=where,
                              guard=ANSWERS.in_process, hint=STATE_HINT)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of bytes", STATE_HINT)
        want = reference_state_bytes(*args)
        if not math.isclose(got, want, rel_tol=1e-9):  # float division in another order
            fail(where, None, f"returned {got:,.1f} bytes per rank, expected {want:,.1f}",
                 _state_hint(got, args))
    print(f"grid_state_bytes: passed on {len(cases)} grids (ZeRO stages 0-3, mixed precision "
          "and fp32, dp, tp and pp from 1 to 64)")


def _telling(sizes, zero):
    """dp, tp, pp that tell the mistakes apart: all different, none the product of the other
    two, and with ZeRO both dp and tp above 1 (so sharding over the wrong one shows)."""
    dp, tp, pp = sizes
    products = (dp == tp * pp, tp == dp * pp, pp == dp * tp)
    return len(set(sizes)) == 3 and not any(products) and (not zero or min(dp, tp) > 1)


def _state_hint(got, args):
    n, dp, tp, pp, zero, mixed = args
    zero_on_tp = reference_state_bytes(n, tp, tp, pp, zero, mixed)  # the shards cut by tp
    if zero and math.isclose(got, zero_on_tp, rel_tol=1e-9):  # stage 0 divides nothing by dp
        return ("that divides by tp where ZeRO divides: ZeRO shards over the dp replicas of a "
                "piece, and tp already cut every weight into tp different slices")
    if math.isclose(got, reference_state_bytes(n, dp, tp, 1, zero, mixed), rel_tol=1e-9):
        return "a pipeline stage holds 1/pp of the layers: divide by pp too"
    if math.isclose(got, reference_state_bytes(n, dp, 1, pp, zero, mixed), rel_tol=1e-9):
        return "tensor parallelism cuts every weight into tp slices: divide by tp too"
    return STATE_HINT
