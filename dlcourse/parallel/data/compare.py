"""The data-parallel variants side by side: wrap, train, time (lesson 03's measurements, its
tests, `benchmarks/data.py` and `dlcourse tour`).

Every variant is a way to wrap a plain model for a process group; the training loop
(`train_step`) is the same for all of them, torch's `DistributedDataParallel` included.
"""

import statistics
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from dlcourse.collectives import CommCounter
from dlcourse.parallel.data.steps import train_step
from dlcourse.parallel.data.overlap import DataParallel

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
    machine hits them all alike. The first round (at least 2 steps each) is a warm-up.
    batch: this rank's (inputs, targets).
    """
    models = {v: wrap(v, make_model(), group, bucket_cap_mb) for v in variants}
    optimizers = {v: torch.optim.SGD(m.parameters(), lr=lr) for v, m in models.items()}
    times = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            for _ in range(steps if r else max(steps, 2)):  # DDP rebuilds its buckets at step 2
                start = time.perf_counter()
                train_step(models[v], optimizers[v], [batch], loss_fn)
                if r:  # round 0 warms up
                    times[v].append(time.perf_counter() - start)
    return {v: statistics.median(t) for v, t in times.items()}


def count_step(variant, model, batch, loss_fn, group, bucket_cap_mb=25.0):
    """The communication of one forward and backward of `model` wrapped as `variant`, recorded
    on this rank by lesson 02's `CommCounter` (`.records`, `.bus_bytes()`, `.by_op()`).

    Two uncounted steps come first: DDP puts everything up to 1 MiB in its first bucket and only
    rebuilds its buckets to `bucket_cap_mb`, in the order the gradients arrived, in step 2.
    """
    model = wrap(variant, model, group, bucket_cap_mb)
    x, y = batch
    for _ in range(2):
        loss_fn(model(x), y).backward()
    model.zero_grad()
    with CommCounter() as comm:
        if variant == DDP:
            comm.watch_ddp(model)  # DDP's buckets are reduced in C++: a comm hook reports them
        loss_fn(model(x), y).backward()
    return comm


def ring_all_reduce_bytes(n_params, world_size, bytes_per_value=4):
    """2Ψ(N-1)/N values: what a ring all-reduce of Ψ gradients sends from each rank (lesson 02)."""
    return 2 * n_params * (world_size - 1) / world_size * bytes_per_value
