"""Published training runs, to check the planner against (lesson 07; tests/test_planner.py).

Each run gives a model, a cluster, the layout the authors used and the speed they reported. The
check: the published layout is among the planner's valid layouts (it fits, no rule broken),
the planner's speed for it is within `TOLERANCE` of the reported one, and where the source
states memory per GPU, the planner's within `MEMORY_TOLERANCE`. Settings a source does not
state (for Narayanan et al., interleaving) are left to the planner: it predicts the fastest
layout that fits among those with the published grid, batch and stated settings. Nothing here
is tuned per run: every run goes through the same `estimate`. One number per GPU is fitted,
its in-step share of the MAMF, on the runs whose `role` is "calibration" (`calibration.py`);
the table's last column says which, and the runs "held out" check it.

The runs themselves, with their sources: `published_runs.py`.
"""

import functools
import itertools
from dataclasses import replace

from dlcourse.planner import margin
from dlcourse.planner.estimate import estimate
from dlcourse.planner.layouts import problems
from dlcourse.planner.published_runs import RUNS

TOLERANCE = 0.20  # the bar: predicted throughput within 20% of published
MEMORY_TOLERANCE = 0.15  # ... and memory per GPU within 15%, where the source states it


def megatron_tflops(work, step_time, n_gpus):
    """Narayanan et al.'s teraFLOP/s per GPU: 96 B s l h^2 (1 + s/6h + V/16lh) / (time n)."""
    m, s = work.model, work.seq_len
    flops = 96 * work.sequences * s * m.n_layers * m.hidden ** 2 * (
        1 + s / (6 * m.hidden) + m.vocab_size / (16 * m.n_layers * m.hidden))
    return flops / (step_time * n_gpus) / 1e12


CHOICES = {"interleave": (1, 2, 4), "mlp": ("eager", "fused"), "micro_batch": (1, 2, 4),
           "recompute": ("none", "op", "full")}
WORKLOAD_CHOICES = ("mlp",)  # the free settings that belong to the `Workload`, not the `Layout`


def candidates(run):
    """(work, layout) for the published layout with every combination of the settings the
    source leaves open, kept where the planner finds no rule broken."""
    free = {k: v for k, v in CHOICES.items() if k in run.free}
    for values in itertools.product(*free.values()):
        chosen = dict(zip(free, values))
        on_work = {k: v for k, v in chosen.items() if k in WORKLOAD_CHOICES}
        work = replace(run.work, **on_work)
        layout = replace(run.layout, **{k: v for k, v in chosen.items() if k not in on_work})
        if "micro_batch" in chosen:  # the same batch in micro-batches of that size
            per_dp = run.layout.micro_batch * run.layout.micro_batches
            layout = replace(layout, micro_batches=max(per_dp // layout.micro_batch, 1))
        if not problems(layout, work, run.cluster):
            yield work, layout


def best_candidate(run):
    """(work, Estimate) of the planner's fastest candidate that fits in memory (any candidate,
    for a run whose `memory_miss` says why none fits); (None, None) if no candidate fits."""
    # estimate(), not rank.plan(): in-step figures without the goodput term (`failures.py`), as
    # the published throughputs are measured over steps in which nothing failed
    pairs = [(w, estimate(w, L, run.cluster)) for w, L in candidates(run)]
    fitting = [(w, e) for w, e in pairs if ran(run, e) or run.memory_miss]
    if not fitting:
        return None, None
    return min(fitting, key=lambda pair: pair[1].step_time)


def ran(run, e):
    """Whether the planner finds room for a candidate of a run that did run: the count and the
    fixed margin (driver, CUDA context, NCCL) within the GPU, without the allocator's 16%
    (`margin.ALLOCATOR`, taken from torchtitan's rows): Llama 3's interleaved 405B layouts
    ran where that allowance would leave no room, so their allocator kept less."""
    return margin.fits(run.cluster.gpu, e.layout, e.memory, allocator=0.0)


def predict(run):
    """The best candidate's estimate (`best_candidate`) and its prediction in the source's
    metric; (None, None) if no candidate fits."""
    work, best = best_candidate(run)
    return (None, None) if best is None else (best, in_metric(run, best))


def in_metric(run, e):
    """An `Estimate` in the metric the source reports."""
    if run.metric == "tflops":
        return megatron_tflops(run.work, e.step_time, run.cluster.n_gpus)
    if run.metric == "seconds":
        return e.step_time
    if run.metric == "tokens/s/GPU":
        return e.tokens_per_s / run.cluster.n_gpus
    return e.mfu


def throughput_error(run, predicted):
    """predicted / published - 1, in throughput (a step time's error is turned round)."""
    ratio = run.value / predicted if run.metric == "seconds" else predicted / run.value
    return ratio - 1


@functools.cache
def comparison():
    """[(run, best Estimate, predicted, throughput error)] for every run, in RUNS's order."""
    rows = []
    for run in RUNS:
        best, predicted = predict(run)
        rows.append((run, best, predicted, None if best is None else
                     throughput_error(run, predicted)))
    return rows


def error_band():
    """(lowest, highest) throughput error over the published runs: the planner's spread. A
    predicted cost c means a real one between c (1 + lowest) and c (1 + highest)."""
    errors = [error for *_, error in comparison() if error is not None]
    return min(errors), max(errors)


def format_comparison(rows=None):
    """The table a reader checks the planner by: run, source, published, predicted, error."""
    lines = [f"{'run':44} {'source':38} {'metric':13} {'published':>9} {'predicted':>9} "
             f"{'error':>6} role"]
    for run, best, predicted, error in rows or comparison():
        got = "no fit" if best is None else f"{predicted:.4g}"
        err = "" if error is None else f"{error:+.0%}"
        lines.append(f"{run.name:44} {run.source:38} {run.metric:13} {run.value:>9.4g} "
                     f"{got:>9} {err:>6} {run.role}" + (" (memory: see note)" if run.memory_miss
                                                         else "") + (" (a miss: see note)" if run.speed_miss else ""))
    return "\n".join(lines)
