"""Check for lesson 11's third exercise (`exercises/11_checkpoints.ipynb`):

    check_checkpoint_interval(checkpoint_interval)

`checkpoint_interval(n_gpus, state_bytes, bandwidth, restart_s, failures_per_gpu_hour)` returns
(τ* in seconds, goodput at τ*) for the lesson's model: M = 3600 / (n_gpus · λ) seconds between
the job's failures, δ = state_bytes / bandwidth, τ* = sqrt(2 δ M) (Young 1974), goodput =
1 - δ/τ* - (τ*/2 + R)/M. Clusters drawn (1K to 64K GPUs, model states, bandwidths, restarts,
failure rates); compared with this module's own arithmetic to 1e-9 relative.
"""

import math

from dlcourse.checks.checkpoint.answers import ANSWERS
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases

HINT = ("M is the job's mean time between failures: any of the n GPUs failing stops it; δ is the "
        "write time; Young's interval is sqrt(2 δ M); a failure costs half an interval and R")


def _reference(n_gpus, state_bytes, bandwidth, restart_s, rate):
    mtbf = 3600.0 / (n_gpus * rate)
    delta = state_bytes / bandwidth
    tau = math.sqrt(2 * delta * mtbf)
    return tau, 1 - delta / tau - (tau / 2 + restart_s) / mtbf, mtbf, delta


def _draw(rng):
    return (rng.choice([1024, 2048, 6144, 16_384, 24_576, 65_536]),
            rng.uniform(0.1, 10) * 1e12, rng.uniform(0.1, 5) * 1e12,
            rng.uniform(60, 1800), rng.uniform(0.5, 5) * 1e-5)


@fresh_cases
def check_checkpoint_interval(checkpoint_interval, *, rng):
    """checkpoint_interval(n_gpus, state_bytes, bandwidth, restart_s, rate) -> (τ*, goodput)."""
    __tracebackhide__ = True
    expect_callable(checkpoint_interval, "checkpoint_interval")
    for _ in range(4):
        args = _draw(rng)
        n, size, bw, restart, rate = args
        where = (f"checkpoint_interval({n:,} GPUs, {size / 1e12:.2f} TB, {bw / 1e12:.2f} TB/s, "
                 f"R = {restart:.0f} s, λ = {rate:.2e} per GPU-hour)")
        got = call_in_process(checkpoint_interval, args, exercise="checkpoint_interval",
                              where=where, guard=ANSWERS.in_process, hint=HINT)
        tau, good, mtbf, delta = _reference(*args)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            fail(where, None, f"returned {got!r}", "return a pair: (τ* in seconds, goodput)")
        got_tau, got_good = (float(v) for v in got)
        if not math.isclose(got_tau, tau, rel_tol=1e-9):
            fail(where, None, f"τ* is {got_tau:.6g} s, the lesson's formula gives {tau:.6g} s",
                 _tau_hint(got_tau, tau, n))
        if not math.isclose(got_good, good, rel_tol=1e-9):
            fail(where, None, f"goodput is {got_good:.9f}, the lesson's formula gives {good:.9f}",
                 _goodput_hint(got_good, tau, delta, restart, mtbf))
    print("checkpoint_interval: passed (4 drawn clusters: Young's interval and the goodput at it)")


def _tau_hint(got, want, n):
    if math.isclose(got * math.sqrt(2), want, rel_tol=1e-6):
        return "that is sqrt(δ M): Young's interval is sqrt(2 δ M)"
    if math.isclose(got, want * math.sqrt(n), rel_tol=1e-6):
        return "that M is one GPU's; the job stops when any of its n GPUs fails: M = 1 / (n λ)"
    if math.isclose(got, want * 60, rel_tol=1e-6) or math.isclose(got * 60, want, rel_tol=1e-6):
        return "λ is per GPU-hour: an hour is 3600 s (not 60)"
    return HINT


def _goodput_hint(got, tau, delta, restart, mtbf):
    """What a wrong goodput left out, from the usual slips."""
    slips = {"a failure also costs the restart R: add R to the work lost":
             1 - delta / tau - (tau / 2) / mtbf,
             "a failure loses half an interval on average, not a whole one":
             1 - delta / tau - (tau + restart) / mtbf,
             "the saving costs δ every τ: subtract δ/τ too":
             1 - (tau / 2 + restart) / mtbf}
    for hint, value in slips.items():
        if math.isclose(got, value, rel_tol=1e-9):
            return hint
    return HINT
