"""The tensor-parallel variants side by side (lesson 04, `lessons/04_tensor_parallel.ipynb`):
from scratch, from scratch with sequence parallelism, and DTensor; one training step each, and
their step times measured in one job (the tour and `benchmarks/tensor.py` use these).

    model, loss_fn, gather = build("tp", make_model, group)
    step(model, optimizer, loss_fn, x, y)
    time_variants(make_model, (x, y), group, rounds=5)   # {variant: median seconds per step}
"""

import statistics
import time
import warnings
from functools import partial

import torch
from torch.distributed.device_mesh import DeviceMesh

from dlcourse.models import lm_loss
from dlcourse.parallel.tensor.dtensor import (dtensor_full_parameters, loss_parallel,
                                              parallelize_dtensor)
from dlcourse.parallel.tensor.loss import vocab_parallel_lm_loss
from dlcourse.parallel.tensor.parallelize import full_parameters, parallelize

VARIANTS = ("tp", "tp+sp", "dtensor", "dtensor+sp")


def build(variant, model, group):
    """The plain `model` made tensor-parallel over `group` as `variant`:
    (parallel model, its loss_fn(logits, targets), fn(model) -> {name: whole parameter})."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown tensor-parallel variant {variant!r}; one of {VARIANTS}")
    sequence_parallel = variant.endswith("+sp")
    if variant.startswith("dtensor"):
        device = next(model.parameters()).device.type
        mesh = DeviceMesh.from_group(group, device)  # a 1-D mesh over the group's ranks
        return parallelize_dtensor(model, mesh, sequence_parallel), lm_loss, dtensor_full_parameters
    return (parallelize(model, group, sequence_parallel), partial(vocab_parallel_lm_loss, group=group),
            partial(full_parameters, group=group))


def step(model, optimizer, loss_fn, x, y):
    """One training step; returns the loss. Under `loss_parallel`: DTensor's vocabulary-sharded
    logits need it in forward and backward, the from-scratch loss does not notice it."""
    with loss_parallel(), warnings.catch_warnings():
        # DTensor's module hooks warn that the token ids need no gradient; they need none
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
    optimizer.step()
    return loss


def time_variants(make_model, batch, group, variants=("tp", "dtensor"), rounds=5, steps=2, lr=1e-3):
    """Median seconds per AdamW step of each variant, side by side in one job, on every rank:
    every round gives each variant `steps` steps, in an order that rotates each round, so a
    slow spell on a shared machine hits them all alike. Round 0 is a warm-up."""
    built = {v: build(v, make_model(), group) for v in variants}
    optimizers = {v: torch.optim.AdamW(built[v][0].parameters(), lr=lr) for v in variants}
    times = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            model, loss_fn, _ = built[v]
            for _ in range(steps):
                start = time.perf_counter()
                step(model, optimizers[v], loss_fn, *batch)
                if r:
                    times[v].append(time.perf_counter() - start)
    return {v: statistics.median(t) for v, t in times.items()}
