"""Published training runs, to check the planner against (lesson 07; tests/test_planner.py).

Each run gives a model, a cluster, the layout the authors used and the speed they reported. The
check: the published layout is among the planner's valid layouts, and the planner's predicted
speed for it is within `TOLERANCE` of the reported one. Settings a paper does not state (the
ZeRO stage, recomputation, interleaving) are left to the planner: it predicts the fastest
layout that fits among those with the published grid and batch.

Sources:
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Table 1: GPT models (vocabulary 51,200, sequence 2,048) on A100 80 GB DGX
  nodes; the teraFLOP/s per GPU they report counts the recomputed forward (their formula
  96 B s l h^2 (1 + s/6h + V/16lh)), so the runs use full recomputation and the comparison uses
  that formula. Sequence parallelism came a year later: off.
- Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B on H100 80 GB, the
  8,192- and 16,384-GPU rows (TP 8, PP 16, sequence 8,192, 16M tokens a batch); reported as
  BF16 MFU.
"""

import itertools
from dataclasses import dataclass, replace

from dlcourse.planner.catalog import LLAMA3_405B, megatron_gpt
from dlcourse.planner.estimate import estimate
from dlcourse.planner.hardware import GPUS, Cluster
from dlcourse.planner.layouts import RECOMPUTE, Layout, Workload, problems

TOLERANCE = 0.25  # the bar: predicted within 25% of published


@dataclass(frozen=True)
class PublishedRun:
    source: str
    work: Workload
    cluster: Cluster
    layout: Layout  # the published grid and batch split
    metric: str  # "tflops" (per GPU, recompute counted, Megatron's formula) or "mfu"
    value: float  # what the paper reports
    fixed: tuple = ()  # layout fields the paper states besides the grid (kept when searching)


def _narayanan(heads, hidden, layers, tp, pp, gpus, batch, tflops):
    spec = megatron_gpt(f"GPT {heads}h {hidden} x {layers}", heads, hidden, layers)
    dp = gpus // (tp * pp)
    layout = Layout(dp, tp, pp, micro_batch=1, micro_batches=batch // dp, recompute="full",
                    sequence_parallel=False)
    return PublishedRun("Narayanan et al. 2021, Table 1", Workload(spec, 2048, batch * 2048),
                        Cluster(GPUS["a100-80gb"], gpus), layout, "tflops", tflops,
                        fixed=("recompute", "sequence_parallel"))


def _llama3(gpus, dp, per_dp, mfu):
    layout = Layout(dp, 8, 16, micro_batch=1, micro_batches=per_dp)
    return PublishedRun("Dubey et al. 2024, Table 4", Workload(LLAMA3_405B, 8192,
                                                                dp * per_dp * 8192),
                        Cluster(GPUS["h100"], gpus), layout, "mfu", mfu)


RUNS = [
    _narayanan(48, 6144, 40, tp=8, pp=1, gpus=256, batch=1024, tflops=135),  # 18.4B
    _narayanan(96, 12288, 80, tp=8, pp=8, gpus=1536, batch=2304, tflops=148),  # 145.6B
    _narayanan(160, 25600, 128, tp=8, pp=64, gpus=3072, batch=3072, tflops=163),  # 1T
    _llama3(8192, 64, 32, mfu=0.43),
    _llama3(16384, 128, 16, mfu=0.41),
]


def megatron_tflops(work, step_time, n_gpus):
    """Narayanan et al.'s teraFLOP/s per GPU: 96 B s l h^2 (1 + s/6h + V/16lh) / (time n)."""
    m, s = work.model, work.seq_len
    flops = 96 * work.sequences * s * m.n_layers * m.hidden ** 2 * (
        1 + s / (6 * m.hidden) + m.vocab_size / (16 * m.n_layers * m.hidden))
    return flops / (step_time * n_gpus) / 1e12


CHOICES = {"zero_stage": (0, 1, 2, 3), "recompute": RECOMPUTE, "interleave": (1, 2, 4)}


def candidates(run):
    """The published layout with every combination of the settings the paper leaves open, kept
    where the planner finds no rule broken."""
    free = {k: v for k, v in CHOICES.items() if k not in run.fixed}
    for values in itertools.product(*free.values()):
        layout = replace(run.layout, **dict(zip(free, values)))
        if not problems(layout, run.work, run.cluster):
            yield layout


def predict(run):
    """The planner's fastest candidate that fits in memory, its estimate, and its prediction in
    the paper's metric; (None, None) if no candidate fits."""
    fitting = [e for e in (estimate(run.work, L, run.cluster) for L in candidates(run)) if e.fits]
    if not fitting:
        return None, None
    best = min(fitting, key=lambda e: e.step_time)
    if run.metric == "tflops":
        return best, megatron_tflops(run.work, best.step_time, run.cluster.n_gpus)
    return best, best.mfu
