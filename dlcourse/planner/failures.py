"""Failures in the planner's figures (lessons 07 and 11): the goodput term.

`estimate()` gives in-step figures: a step's time, tokens/s, MFU and $ per million tokens while
nothing fails. At scale a job also stops for failures, saves checkpoints and redoes lost work;
lesson 11's `goodput.py` turns that into the fraction of time that trains something kept.
`rank.plan` multiplies every layout's tokens/s by it and divides its $ per million tokens by it
(`with_failures`); MFU and the step time stay the in-step figures (they describe a step, and the
published MFUs the planner is checked against are measured over steps, not days).

The assumptions, stated once:
- failures: Llama 3's rate per GPU (`goodput.LLAMA3_RATE`, Dubey et al. 2024 §3.3.4, Table 5,
  over 16,384 GPUs: our assumption, the paper gives no GPU count for its 54-day snapshot);
- what a checkpoint saves: every parameter's bf16 weight, fp32 master copy and Adam's two fp32
  moments, 2 + 12 = 14 bytes (lesson 11's assumption; gradients are not saved). Any layout
  holds the same unique state: sharding changes who writes which bytes, replicas write one
  copy, so the bytes per GPU are 14 Ψ / N when the N GPUs write in parallel;
- the storage: Llama 3's Tectonic, 2 TB/s sustained (§3.3.1; 7 TB/s at peak);
- a restart (re-scheduling, loading, warming up): 10 minutes, an assumption (lesson 11);
- the interval: Daly's (2006) τ, the goodput Young's first-order formula at it.

The factor is the same for every layout of one model on one cluster, so it never changes the
ranking; it changes what a run at that scale costs.
"""

from dataclasses import replace

from dlcourse.memory.calculator import spec_params
from dlcourse.planner import goodput

SAVED_BYTES_PER_PARAM = 2 + 12  # bf16 weight; fp32 master weight, Adam's m and v
STORAGE_BW = 2e12  # bytes/s: Llama 3's Tectonic, sustained (Dubey et al. 2024, §3.3.1)
RESTART_S = 10 * 60  # an assumption, as in lesson 11
INTERVAL = "daly"


def total_params(spec):
    """Ψ of a dense `ModelSpec` or of an MoE spec (every expert counted: all are saved)."""
    if hasattr(spec, "n_experts"):
        from dlcourse.planner.moe_spec import moe_params
        return sum(moe_params(spec).values())
    return spec_params(spec)


def saved_bytes(spec):
    """The bytes one checkpoint of `spec` writes: 14 Ψ."""
    return SAVED_BYTES_PER_PARAM * total_params(spec)


def cost_at_scale(work, cluster, include_failures=True):
    """goodput.py's `FailureCost` of `work` on `cluster` at Daly's interval, or None when the
    failures are left out (`dlcourse plan --no-failures`)."""
    if not include_failures:
        return None
    return goodput.failure_cost(cluster.n_gpus, saved_bytes(work.model), STORAGE_BW,
                                restart_s=RESTART_S, interval=INTERVAL)


def with_failures(e, cost):
    """An `Estimate` whose tokens/s and $ per million tokens include failures: the in-step ones
    times goodput and over goodput. MFU and the step time stay in-step. `cost` None: unchanged."""
    if cost is None:
        return e
    g = cost.goodput
    if g <= 0:  # failures stop it more often than it saves: no tokens kept
        return replace(e, tokens_per_s=0.0, dollars_per_m_tokens=float("inf"), goodput=0.0)
    return replace(e, tokens_per_s=e.tokens_per_s * g,
                   dollars_per_m_tokens=e.dollars_per_m_tokens / g, goodput=g)


def goodput_line(cost):
    """One line saying goodput's share in the table, or that it is left out."""
    if cost is None:
        return ("tokens/s and $/M tok leave failures out (--no-failures): in-step figures, as "
                "MFU")
    return (f"goodput {cost.goodput:.2%} at {cost.n_gpus:,} GPUs: checkpoint every "
            f"{cost.interval_s:,.0f} s (Daly; δ = {cost.delta_s:.2g} s to write "
            f"{SAVED_BYTES_PER_PARAM} B x Ψ at {STORAGE_BW / 1e12:g} TB/s), MTBF "
            f"{cost.mtbf_s / 3600:,.1f} h (Llama 3's failure rate), restart "
            f"{cost.restart_s / 60:.0f} min; tokens/s and $/M tok include it, MFU and step s do "
            "not; --no-failures leaves it out")
