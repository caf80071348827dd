"""The tour's ZeRO rows (lesson 05): stages 1, 2, 3, and stages 2 (ZeRO-Offload) and 3 with CPU
offload, from scratch; torch's ZeroRedundancyOptimizer and FSDP2. Each row trains on every rank,
returns the full (gathered) parameters for the comparison and this rank's model-state bytes, and
counts one step's communication apart, on a fresh copy, so that counting does not slow the timed
steps."""

import torch.distributed as dist

from dlcourse.memory import measure_model_state, peak_activations
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.zero import ZeroAdamW, zero
from dlcourse.parallel.zero.measure import count_step, held_bytes
from dlcourse.parallel.zero.torch_api import (
    fsdp2,
    fsdp2_full_parameters,
    fsdp2_held_bytes,
    zero_redundancy,
    zero_redundancy_state_bytes,
)
from dlcourse.tour.common import RowResult, mean_over_ranks, timed_steps


def _zero(stage, offload):
    def make(cfg, group):
        model = zero(stage, cfg.new_model(), group)
        optimizer = ZeroAdamW(model, lr=cfg.lr, offload=offload)
        return model, optimizer, model.full_parameters, held_bytes
    return make


def _zero_redundancy(cfg, group):
    model, optimizer = zero_redundancy(cfg.new_model(), group, lr=cfg.lr)

    def held(model, optimizer):
        return measure_model_state(model.module).params + measure_model_state(
            model.module).grads + zero_redundancy_state_bytes(optimizer)
    return model, optimizer, lambda: dict(model.module.named_parameters()), held


def _fsdp2(cfg, group):
    model, optimizer = fsdp2(cfg.new_model(), group, lr=cfg.lr)
    return model, optimizer, lambda: fsdp2_full_parameters(model), fsdp2_held_bytes


MAKERS = {
    "stage 1": _zero(1, False), "stage 2": _zero(2, False), "stage 3": _zero(3, False),
    "stage 2 + offload": _zero(2, True),  # ZeRO-Offload (Ren et al. 2021) is built on stage 2
    "stage 3 + offload": _zero(3, True), "ZeroRedundancyOptimizer": _zero_redundancy,
    "FSDP2": _fsdp2,
}


def train_zero_row(variant, cfg):
    """cfg.steps AdamW steps of the course GPT as `variant` (a key of MAKERS) on every rank."""
    if variant not in MAKERS:
        raise ValueError(f"unknown ZeRO tour row {variant!r}; choose from {list(MAKERS)}")
    group = dist.group.WORLD
    model, optimizer, full_parameters, held = MAKERS[variant](cfg, group)
    batch = shard_batch(cfg.data(), group)  # this rank's contiguous slice of the global batch
    loss, step_time = timed_steps(cfg, model, optimizer, *batch)
    state = held(model, optimizer)
    params = {k: v.detach().to("cpu", copy=True) for k, v in full_parameters().items()}
    fresh, fresh_optimizer, _, _ = MAKERS[variant](cfg, group)
    counted = lambda: count_step(fresh, fresh_optimizer, *batch)  # noqa: E731
    activations = None
    if variant.startswith("stage"):  # torch's wrap their parameters beyond lesson 01's log
        comm, activations = peak_activations(fresh, counted, ignore=batch)
    else:
        comm = counted()
    return RowResult(mean_over_ranks(loss, cfg), params, round(getattr(state, "model_state", state)),
                     round(comm.bus_bytes()), step_time, activations)
