"""What failures cost a long run: interruptions, the checkpoint interval, goodput (lesson 11,
`lessons/11_checkpoints.ipynb`; the planner multiplies its tokens/s by `goodput_factor`, see
`planner/failures.py`).

The failure rate, from Llama 3 (Dubey et al. 2024, arXiv 2407.21783; read in the paper's text
dated July 23, 2024): "during a 54-day snapshot period of pre-training" of Llama 3 405B the job
had 466 interruptions, 47 planned and 419 unexpected (§3.3.4; Table 5 sorts the 419 by cause).
The paper does not say how many GPUs the snapshot ran on: 405B "is trained on up to 16K H100
GPUs" (§3.3.1) and Table 4's stages use 8,192 or 16,384. We take 16,384 (an assumption: on
8,192 the rate per GPU would be twice as high). Assuming further (1) every unexpected
interruption is one GPU-server's failure, independent of the others, at a constant rate (a
Poisson process), and (2) the rate scales with the number of GPUs:

    λ = 419 / (16,384 GPUs x 54 x 24 h)       failures per GPU-hour
    M = 1 / (N λ)                             the job's mean time between failures on N GPUs

A checkpoint takes δ = bytes / bandwidth to write (the model state, as the training blocks on
it). With one every τ seconds of training and R seconds to restart and reload after a failure,
the first-order fraction of time lost (Young 1974) is δ/τ (saving) + (τ/2 + R)/M (on average half
an interval of work redone, and the restart, per failure), so

    goodput(τ) = 1 - δ/τ - (τ/2 + R)/M,       best at τ* = sqrt(2 δ M)

Daly (2006) refines τ* for δ not small against M; both assume failures never strike during a
save or a restart. Planned interruptions (the other 47) are left out: a job saves before them.
"""

import math
from dataclasses import dataclass

HOURS = 3600.0
# Llama 3: unexpected interruptions and days of the snapshot (§3.3.4, Table 5); the GPUs are
# our assumption, the largest configuration of Table 4 (the paper gives none for the snapshot)
LLAMA3_UNEXPECTED, LLAMA3_GPUS, LLAMA3_DAYS = 419, 16_384, 54
LLAMA3_RATE = LLAMA3_UNEXPECTED / (LLAMA3_GPUS * LLAMA3_DAYS * 24)  # λ, failures per GPU-hour


def mtbf_s(n_gpus, rate_per_gpu_hour=LLAMA3_RATE):
    """M: the job's mean seconds between failures on n_gpus GPUs (any one of them stops it)."""
    if n_gpus < 1 or rate_per_gpu_hour <= 0:
        raise ValueError(f"need n_gpus >= 1 and a failure rate > 0, got {n_gpus}, "
                         f"{rate_per_gpu_hour}")
    return HOURS / (n_gpus * rate_per_gpu_hour)


def interruptions_per_day(n_gpus, rate_per_gpu_hour=LLAMA3_RATE):
    return 24 * HOURS / mtbf_s(n_gpus, rate_per_gpu_hour)


def write_time_s(state_bytes, bandwidth_bytes_s):
    """δ: seconds to write the model state at the storage's aggregate bandwidth."""
    return state_bytes / bandwidth_bytes_s


def young_interval_s(delta_s, mtbf):
    """τ* = sqrt(2 δ M), Young (1974): the interval that minimises δ/τ + τ/(2M)."""
    return math.sqrt(2 * delta_s * mtbf)


def daly_interval_s(delta_s, mtbf):
    """Daly (2006): sqrt(2δM) [1 + sqrt(δ/(2M))/3 + (δ/(2M))/9] - δ while δ < 2M, else M
    (its Figs. 3-5: M = 24 h, 6 h, 15 min with δ = 5 min give τ = 117, 57, 9.1 min)."""
    if delta_s >= 2 * mtbf:
        return mtbf
    x = delta_s / (2 * mtbf)
    return math.sqrt(2 * delta_s * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta_s


def lost_per_failure_s(interval_s, restart_s):
    """Work lost by one failure, on average: half an interval redone, plus the restart."""
    return interval_s / 2 + restart_s


def goodput(interval_s, delta_s, mtbf, restart_s=0.0):
    """The fraction of time that trains something kept: 1 - δ/τ - (τ/2 + R)/M (at least 0)."""
    if interval_s <= 0:
        raise ValueError(f"the checkpoint interval must be > 0 seconds, got {interval_s}")
    return max(0.0, 1 - delta_s / interval_s - lost_per_failure_s(interval_s, restart_s) / mtbf)


@dataclass
class FailureCost:
    n_gpus: int
    mtbf_s: float  # M
    interruptions_per_day: float
    delta_s: float  # δ: one checkpoint's write
    interval_s: float  # τ*, Young's (or Daly's, as asked)
    lost_per_failure_s: float  # τ*/2 + R
    goodput: float  # at τ*
    restart_s: float = 0.0  # R
    rule: str = "young"  # whose interval τ* is


INTERVALS = {"young": young_interval_s, "daly": daly_interval_s}


def failure_cost(n_gpus, state_bytes, bandwidth_bytes_s, restart_s=0.0,
                 rate_per_gpu_hour=LLAMA3_RATE, interval="young"):
    """Everything above for one cluster and model state, at Young's interval (or Daly's with
    interval="daly": the planner's choice)."""
    if interval not in INTERVALS:
        raise ValueError(f"interval must be one of {sorted(INTERVALS)}, got {interval!r}")
    m = mtbf_s(n_gpus, rate_per_gpu_hour)
    delta = write_time_s(state_bytes, bandwidth_bytes_s)
    tau = INTERVALS[interval](delta, m)
    return FailureCost(n_gpus, m, interruptions_per_day(n_gpus, rate_per_gpu_hour), delta, tau,
                       lost_per_failure_s(tau, restart_s), goodput(tau, delta, m, restart_s),
                       restart_s, interval)


def goodput_factor(n_gpus, state_bytes, bandwidth_bytes_s, restart_s=0.0,
                   rate_per_gpu_hour=LLAMA3_RATE, include_failures=True, interval="young"):
    """What the planner multiplies its tokens/s by (and divides its $/M tokens by): the goodput at
    Young's (or Daly's) interval, or 1.0 with include_failures=False (the planner's flag to leave
    it out; `planner/failures.py` calls this with Daly's interval)."""
    if not include_failures:
        return 1.0
    return failure_cost(n_gpus, state_bytes, bandwidth_bytes_s, restart_s,
                        rate_per_gpu_hour, interval).goodput
