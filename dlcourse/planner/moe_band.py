"""The planner's error on the published mixture-of-experts runs, as the band a plan of an MoE
is read with (lesson 09's planner; the dense band is lesson 07's, `published.error_band`).

The rule is the dense band's: the lowest and highest throughput error (predicted / published
throughput - 1, a step time's error turned round) over the runs held against the planner,
`published_moe.RUNS`. The ranking ties two layouts whose costs lie within the larger side of
it (`bands.tie_band`), and the recommended cost is printed stretched by it (`bands.cost_band`).

A named miss (`MoERun.miss`) is a run the planner is known to get wrong for a stated reason.
It is left out of the band, and named beside it: a band that took it in would be the miss's
size for every layout, also for those that share nothing with it. What a miss does bound is a
layout in its regime. Both named misses are Megatron-Core's Qwen3-235B rows whose experts get
the fewest rows a GEMM (1,024 and 512, against 4,096 and more for every run in the band;
`published_moe`'s docstring, `moe_cost.expert_gemms`), so the regime is measured by that one
number (`regime`): a layout whose experts get no more rows than a miss's is outside what the
band can claim; one with at least the fewest rows of a run in the band is inside; one between
them is covered by neither. The misses are one-sided (the planner too fast by 77% and 92% in
throughput), so a layout in their regime may cost far more than predicted, and the planner
cannot say it ties with one the band backs. Among the layouts that tie, the decision takes
first those the runs back (`trust`: the band's regime, then between, then a miss's), then the
simplest, then the cheapest (`rank.Plan.tied`); when every tied layout is in a miss's regime
the plan still recommends one, and says the band is not backed there. Rows a GEMM is the term
the published table fixes, not a measured cause (`published_moe`: the planner's roofline finds
those GEMMs compute-bound); it is the proxy the misses give.
"""

import functools

from dlcourse.planner import moe_cost
from dlcourse.planner.published_moe import RUNS, held_against


def throughput_error(found):
    """predicted / published throughput - 1 of a `held_against` result: published step time /
    the planner's - 1 (the dense runs' sign: + when the planner is too fast)."""
    return found["published"] / found["planner"] - 1


def expert_rows(work, layout):
    """Rows one expert of the busiest rank multiplies in one GEMM, one micro-batch
    (`moe_cost.expert_gemms`'s M): the size the named misses are told apart by."""
    return moe_cost.expert_gemms(work.model, layout, work.seq_len)[0][0]


@functools.cache
def held():
    """[(run, throughput error, expert rows)] for every published MoE run, in RUNS's order."""
    return [(run, throughput_error(held_against(run)), expert_rows(run.work, run.layout))
            for run in RUNS]


def error_band():
    """(lowest, highest) throughput error over the published MoE runs that are not named
    misses: the planner's spread on MoE runs, read as `published.error_band` is."""
    errors = [error for run, error, _ in held() if not run.miss]
    return min(errors), max(errors)


def named_misses():
    """[(run, throughput error)] of the named misses whose error lies outside `error_band`."""
    low, high = error_band()
    return [(run, error) for run, error, _ in held()
            if run.miss and not low <= error <= high]


def regime(work, layout):
    """Where `layout`'s expert GEMMs lie against the runs': ("band", rows) with at least the
    fewest rows of a run in the band, ("miss", rows) with no more than the most of a named
    miss, ("between", rows) otherwise."""
    rows = expert_rows(work, layout)
    if rows >= min(r for run, _, r in held() if not run.miss):
        return "band", rows
    if rows <= max(r for run, _, r in held() if run.miss):
        return "miss", rows
    return "between", rows


TRUST = {"band": 0, "between": 1, "miss": 2}  # the decision's order: backed first


def trust(work, layout):
    """0 when the band backs `layout` (`regime` "band"), 1 between, 2 in a named miss's."""
    return TRUST[regime(work, layout)[0]]


def backed_better(work, layout, other, name="runner-up"):
    """Why `layout` was taken over `other` (the `name`), which the runs back less (`trust`),
    or None when both are backed alike."""
    if trust(work, layout) == trust(work, other):
        return None
    (_, mine), (where, theirs) = regime(work, layout), regime(work, other)
    few = "as few as a named miss's" if where == "miss" else "fewer than any run in the band"
    return (f"its experts get {mine:,.0f} rows a GEMM, the {name}'s {theirs:,.0f}, {few} "
            "(planner/moe_band.py)")


def band_lines(work, layout):
    """Lines under an MoE plan's recommendation: each named miss outside the band and why,
    then whether the recommended `layout`'s expert GEMMs are in the band's regime."""
    lines = [f"  outside that band, a named miss: {run.name}, planner {error:+.0%} in "
             f"throughput: {run.miss.replace('module docstring', 'planner/published_moe.py')}"
             for run, error in named_misses()]
    where, rows = regime(work, layout)
    band_rows = sorted(r for run, _, r in held() if not run.miss)
    miss_rows = sorted(r for run, _, r in held() if run.miss)
    said = {"band": "as many as the runs in the band: it applies",
            "miss": "no more than a named miss's: the band is not backed there",
            "between": "fewer than the runs in the band, more than the misses: neither "
                       "backs it"}[where]
    return lines + [f"  each expert of the recommended layout gets {rows:,.0f} rows a GEMM "
                    f"(runs in the band {band_rows[0]:,.0f} to {band_rows[-1]:,.0f}, named "
                    f"misses {', '.join(f'{r:,.0f}' for r in miss_rows)}), {said} "
                    "(planner/moe_band.py)"]
