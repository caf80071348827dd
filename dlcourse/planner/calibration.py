"""Where the planner's per-GPU constant comes from (lesson 07): what a matmul keeps of its MAMF
inside a training step, the GPU's `in_step_share` (`hardware.py`).

A matmul alone reaches its GPU's MAMF (`hardware.py`: 85.9% of peak on the A100). Inside a
training step it reaches less: it shares the GPU with NCCL's kernels, waits on launches and
synchronisations, and runs at the shapes the model has, not the best ones. How much less is
measured, not derived: Korthikanti et al. 2022, Table 4, time one transformer layer of their
22B GPT (Table 3: h 6,144, 64 heads, tp 8, micro-batch 4, 2,048 tokens) on an A100 80 GB:
19.6 ms forward and backward, without recomputation or sequence parallelism. Take off what
the planner itself models for that layer (tp's four all-reduces, the element-wise kernels at
HBM bandwidth) and what is left is the matmuls' time: their FLOPs over it is the share of
peak they sustain in a layer, and over the A100's MAMF, the share of the MAMF
(`IN_LAYER_SHARE` in hardware.py): the A100's share.

Other GPUs are fitted on published runs of their own (`fit_share`): the share at which the
planner's throughput over the runs marked "calibration" on that GPU (`published_runs.py`) is
right on average (the geometric mean of predicted / published is 1). One number a GPU, each
checked on the runs of that GPU held out. The H100 SXM's (five of Megatron-LM's nine H100
rows) comes out at 0.72, the A100 layer's 0.73 within rounding: the same software keeps the
same share of a faster chip. torchtitan's 500 W HBM2e H100 keeps 0.53: its power limit lowers
the clock its matmuls run at (its lower memory bandwidth is `hbm_bw`'s, not the share's), and
its eager, unfused kernels and a peak its source calls unknown are in that one number too
(`published_runs.TORCHTITAN_H100`).
"""

import math
from dataclasses import replace

from dlcourse.planner.catalog import megatron_gpt
from dlcourse.planner.hardware import GPUS, Cluster
from dlcourse.planner.layouts import Layout, Workload
from dlcourse.planner.timing import elementwise_bytes, tp_time

LAYER_SECONDS = 19.6e-3  # Korthikanti et al. 2022, Table 4, "Baseline no recompute"
A100_MAMF = 0.859  # Bekman, ml-engineering: 267.9 of 312 TFLOPS


def measured_layer():
    """(Workload, Layout, Cluster) of Korthikanti et al.'s Table 4 layer: the 22B GPT on one
    DGX A100 node (tp 8), micro-batch 4, no sequence parallelism, eager attention."""
    spec = megatron_gpt("GPT 22B", 64, 6144, 48)
    work = Workload(spec, 2048, 4 * 2048, attention="eager")
    layout = Layout(1, 8, 1, micro_batch=4, sequence_parallel=False)
    return work, layout, Cluster(GPUS["a100-80gb"], 8)


def in_layer_efficiency():
    """The share of the A100's peak its matmuls sustain inside the measured layer: the
    layer's matmul FLOPs per GPU, (72 h^2 + 12 h s) per token / tp, over the measured time
    less the planner's tp and element-wise terms for one layer."""
    work, layout, cluster = measured_layer()
    h, s = work.model.hidden, work.seq_len
    tokens = layout.micro_batch * s
    flops = (72 * h * h + 12 * h * s) * tokens / layout.tp
    modelled = (tp_time(work, layout, cluster) / work.model.n_layers
                + elementwise_bytes(work, layout) / cluster.gpu.hbm_bw)
    return flops / (LAYER_SECONDS - modelled) / cluster.gpu.peak_flops


def in_layer_share():
    """In-layer efficiency over the MAMF: what a training step keeps of a lone matmul."""
    return in_layer_efficiency() / A100_MAMF


def calibration_runs(gpu_name):
    """The published runs marked "calibration" on the GPU called `gpu_name`."""
    from dlcourse.planner.published_runs import CALIBRATION, RUNS
    return [r for r in RUNS if r.role == CALIBRATION and r.cluster.gpu.name == gpu_name]


def with_share(run, share):
    """`run` on its GPU with in-step share `share`."""
    gpu = replace(run.cluster.gpu, in_step_share=share)
    return replace(run, cluster=replace(run.cluster, gpu=gpu))


def mean_log_error(runs, share):
    """Mean of log(predicted / published throughput) over `runs` at in-step share `share`."""
    from dlcourse.planner.published import predict, throughput_error
    logs = []
    for run in runs:
        run = with_share(run, share)
        logs.append(math.log1p(throughput_error(run, predict(run)[1])))
    return sum(logs) / len(logs)


def fit_share(gpu_name, share=0.7, steps=6):
    """The in-step share at which the planner is right on average over the GPU's calibration
    runs. The step time is nearly all share-bound compute, so dividing the share by the
    geometric-mean error converges in a few steps (communication and element-wise time,
    which the share does not touch, make each step a little short)."""
    runs = calibration_runs(gpu_name)
    for _ in range(steps):
        share /= math.exp(mean_log_error(runs, share))
    return share
