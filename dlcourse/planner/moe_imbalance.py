"""The load imbalance of dropless routing, calibrated on published pairs of the same run with
and without forced balance (lesson 09; the runs are `published_moe.py`'s): the factor (busiest
expert against the mean) at which the planner's dropless step time over its balanced one is the
published ratio. Qwen3-235B's 16K row of the zoo's "Long Context" table (`published_moe.ZOO`)
sets `moe_cost.DROPLESS_IMBALANCE` (the 32K to 128K rows held out); Mixtral 8x22B's pair sets
the catalogue's `MIXTRAL_IMBALANCE` (its 8x7B run held out).
"""

from dataclasses import replace

from dlcourse.planner.catalog import QWEN3_235B
from dlcourse.planner.hardware import Cluster, gpu
from dlcourse.planner.layouts import Layout, Workload
from dlcourse.planner.moe_cost import Recipe
from dlcourse.planner.moe_estimate import moe_estimate
from dlcourse.planner.published_moe import MIXTRAL_PAIR


# (sequence length, cp, TFLOPS a GPU with forced balance, dropless): `published_moe.ZOO`'s
# "Long Context" table
LONG_CONTEXT = [(16384, 1, 295, 237), (32768, 2, 335, 277), (65536, 4, 368, 320),
                (131072, 8, 389, 357)]


def dropless_over_balanced(work, L, cluster, recipe, imbalance=None):
    """The planner's step time of `work` dropless over the same with each expert exactly its
    share (capacity factor 1): dropless at `imbalance` x the mean, given as a capacity factor
    (the busiest rank's E/ep experts at ceil(c k N / E) rows each, lesson 09's `capacity`), or
    at the model's own (`moe_cost.imbalance`) when None."""
    times = [moe_estimate(replace(work, model=replace(work.model, capacity_factor=c)), L,
                          cluster, recipe).step_time for c in (1.0, imbalance)]
    return times[1] / times[0]


def dropless_slowdown(seq_len, cp, imbalance=None):
    """`dropless_over_balanced` for a `LONG_CONTEXT` row (Qwen3-235B: `DROPLESS_IMBALANCE`
    when None)."""
    L = Layout(256 // (4 * cp * 8), 4, 8, zero_stage=1, micro_batches=8 * 4 * cp,
               recompute="full", interleave=4, cp=cp, ep=8)
    work = Workload(replace(QWEN3_235B, seq_len=seq_len), seq_len, 256 * seq_len, mlp="fused")
    return dropless_over_balanced(work, L, Cluster(gpu("h100"), 256), Recipe(dispatcher="deepep"),
                                  imbalance)


def _bisect(slowdown, target):
    """The factor in [1, 4] at which the increasing `slowdown(factor)` is `target`."""
    low, high = 1.0, 4.0
    for _ in range(40):
        middle = (low + high) / 2
        if slowdown(middle) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def implied_imbalance(seq_len, cp, balanced_tflops, dropless_tflops):
    """The busiest-against-mean factor at which the planner's `dropless_slowdown` is the
    published one (TFLOPS balanced / dropless), by bisection between 1 and 4."""
    return _bisect(lambda f: dropless_slowdown(seq_len, cp, f), balanced_tflops / dropless_tflops)


def pair_imbalance(pair=MIXTRAL_PAIR):
    """The same for a (run, TFLOPS balanced, dropless) pair: `MIXTRAL_PAIR`'s is the
    catalogue's `MIXTRAL_IMBALANCE`."""
    run, balanced, dropless = pair
    return _bisect(lambda f: dropless_over_balanced(run.work, run.layout, run.cluster,
                                                    run.recipe, f), balanced / dropless)
