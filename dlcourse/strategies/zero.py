"""Lesson 05's ZeRO in the catalogue (`lessons/05_zero.ipynb`): stages 1, 2, 3 and stages 2
(ZeRO-Offload) and 3 with the optimizer on the CPU, from scratch; torch's ZeroRedundancyOptimizer
and FSDP2. Each shards over the dp group and trains on this rank's slice of the batch; its full
parameters are gathered the strategy's own way."""

from functools import partial

from dlcourse.memory import measure_model_state, peak_activations
from dlcourse.models import lm_loss
from dlcourse.parallel.data import steps
from dlcourse.parallel.zero import ZeroAdamW, zero
from dlcourse.parallel.zero.measure import count_step, held_bytes
from dlcourse.parallel.zero.torch_api import (fsdp2, fsdp2_full_parameters, fsdp2_held_bytes,
                                              zero_redundancy, zero_redundancy_state_bytes)
from dlcourse.strategies.trainer import Trainer, rank_of


def build_zero(stage, offload, cfg, groups):
    """Lesson 05's `zero(stage)` with its `ZeroAdamW` (clipping by the global norm, if
    cfg.max_grad_norm)."""
    buckets = {"bucket_cap_mb": cfg.bucket_cap_mb} if stage < 3 else {}  # stage 3: by unit
    model = zero(stage, cfg.new_model(), groups.dp, **buckets)
    optimizer = ZeroAdamW(model, lr=cfg.lr, offload=offload, max_grad_norm=cfg.max_grad_norm)
    return _trainer(model, optimizer, model.full_parameters,
                    lambda: held_bytes(model, optimizer).model_state, groups.dp)


def build_zero_redundancy(cfg, groups):
    """torch's ZeroRedundancyOptimizer (AdamW state sharded) around DDP."""
    model, optimizer = zero_redundancy(cfg.new_model(), groups.dp, lr=cfg.lr)

    def held():
        state = measure_model_state(model.module)
        return state.params + state.grads + zero_redundancy_state_bytes(optimizer)
    full = lambda: dict(model.module.named_parameters())  # noqa: E731  (whole on every rank)
    return _trainer(model, optimizer, full, held, groups.dp, activations=False,
                    modules=[model.module])


def build_fsdp2(cfg, groups):
    """torch's FSDP2 (`fully_shard` on every block and the root): dim-0 sharded DTensors."""
    model, optimizer = fsdp2(cfg.new_model(), groups.dp, lr=cfg.lr)
    return _trainer(model, optimizer, lambda: fsdp2_full_parameters(model),
                    lambda: fsdp2_held_bytes(model, optimizer).model_state, groups.dp,
                    activations=False)


def _trainer(model, optimizer, full_parameters, held, group, activations=True, modules=None):
    def train_step(x, y):
        return steps.train_step(model, optimizer, [steps.shard_batch((x, y), group)], lm_loss)
    return Trainer(modules or [model], optimizer, train_step, full_parameters, held,
                   partial(_count, model, group, activations), dp=rank_of(group), model=model)


def _count(model, group, activations, trainer, x, y):
    """One whole step (forward, backward, optimizer step) on this rank's slice, counted;
    activations only where lesson 01's log can key the parameters (not torch's wrappers')."""
    batch = steps.shard_batch((x, y), group)
    counted = lambda: count_step(model, trainer.optimizer, *batch)  # noqa: E731
    if not activations:
        return round(counted().bus_bytes()), None
    comm, peak = peak_activations(model, counted, ignore=batch)
    return round(comm.bus_bytes()), peak
