"""Which error band a plan is judged by (lesson 07; lesson 09 for a mixture of experts): the
planner's spread on the published runs of the workload's kind. Two layouts whose costs lie
within it tie (`tie_band`), the recommended cost is printed stretched by it (`cost_band`), and
for a mixture of experts the runs also say which layouts they back (`trust`, `moe_band.py`).
"""

from dlcourse.planner import moe_band, published


def is_moe(work):
    """Whether `work`'s model is a mixture of experts (lesson 09's spec has n_experts)."""
    return hasattr(work.model, "n_experts")


def error_band(work=None):
    """(lowest, highest) throughput error of the planner on the published runs of `work`'s
    kind: a mixture of experts' on the MoE runs, named misses aside (`moe_band.error_band`);
    any other model's (and None's) on the dense runs (`published.error_band`)."""
    return (moe_band if work is not None and is_moe(work) else published).error_band()


def trust(work, layout):
    """How far the published runs back `layout`'s estimate: 0 for a dense model (its band
    covers every layout), `moe_band.trust` for a mixture of experts."""
    return moe_band.trust(work, layout) if is_moe(work) else 0


def band_source(work=None):
    """What `error_band(work)` was measured on, in words."""
    if work is not None and is_moe(work):
        misses = sum(bool(run.miss) for run, *_ in moe_band.held())
        return (f"{len(moe_band.held()) - misses} published MoE runs, {misses} named "
                f"misses aside")
    return f"{len(published.RUNS)} published runs"


def tie_band(work=None):
    """The relative cost difference the planner cannot resolve: the larger side of its error
    on the published runs of `work`'s kind (`error_band`)."""
    low, high = error_band(work)
    return max(-low, high)


def cost_band(e, work=None):
    """($ low, $ high) per million tokens of an Estimate: its cost stretched by the spread of
    the planner's throughput errors on the published runs of `work`'s kind (`error_band`; a
    throughput predicted (1 + err) times too high is a cost (1 + err) times too low)."""
    low, high = error_band(work)
    return e.dollars_per_m_tokens * (1 + low), e.dollars_per_m_tokens * (1 + high)
