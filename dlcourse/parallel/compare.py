"""The data-parallel variants side by side: wrap, train, time (lesson 03's measurements, its
tests, `benchmarks/data_parallel.py` and `dlcourse tour`).

Every variant is a way to wrap a plain model for a process group; the training loop
(`train_step`) is the same for all of them, torch's `DistributedDataParallel` included.
"""

import statistics
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from dlcourse.parallel.data import train_step
from dlcourse.parallel.overlap import DataParallel

# name -> DataParallel options that define the variant (they override the caller's)
VARIANTS = {
    "naive": dict(bucket_cap_mb=0, overlap=False),  # one all-reduce per gradient, after backward
    "bucketed": dict(overlap=False),  # one all-reduce per bucket, after backward
    "overlapped": dict(overlap=True),  # buckets all-reduced during backward
}
DDP = "torch DDP"
NAMES = [*VARIANTS, DDP]


def wrap(variant, model, group, bucket_cap_mb=25.0, find_unused_parameters=False, timeline=None):
    """Wrap `model` for data parallelism over `group` as `variant` (a name in NAMES)."""
    if variant == DDP:
        return DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_cap_mb,
                                       find_unused_parameters=find_unused_parameters)
    if variant not in VARIANTS:
        raise ValueError(f"unknown data-parallel variant {variant!r}; choose from {NAMES}")
    options = dict(bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
                   timeline=timeline)
    return DataParallel(model, group, **{**options, **VARIANTS[variant]})


def time_variants(make_model, batch, loss_fn, group, variants=NAMES, rounds=5, steps=3,
                  bucket_cap_mb=25.0, lr=1e-3):
    """Median seconds per SGD step of each variant, measured side by side in one job.

    Runs on every rank. All variants are built first, then `rounds` rounds each give every
    variant `steps` steps, in an order that rotates each round, so a slow spell on a shared
    machine hits them all alike. The first round is a warm-up and not counted.
    batch: this rank's (inputs, targets).
    """
    models = {v: wrap(v, make_model(), group, bucket_cap_mb) for v in variants}
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=lr) for v, m in models.items()}
    times = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            for _ in range(steps):
                start = time.perf_counter()
                train_step(models[v], optimizers[v], [batch], loss_fn)
                if r:  # round 0 warms up
                    times[v].append(time.perf_counter() - start)
    return {v: statistics.median(t) for v, t in times.items()}
