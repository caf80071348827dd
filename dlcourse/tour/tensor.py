"""The tour's tensor-parallel rows (lesson 04): from-scratch TP, TP + sequence parallelism, and
DTensor TP, each on a tensor-parallel group of all the job's ranks (tp = world size). Every rank
trains on the whole global batch (tensor parallelism splits the model, not the data) and returns
the whole parameters, gathered, for the comparison with the reference."""

import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import peak_activations, storage_bytes
from dlcourse.parallel.tensor.compare import build, step
from dlcourse.tour.common import RowResult


def train_tp_row(variant, cfg):
    """cfg.steps AdamW steps of the course GPT made tensor-parallel as `variant` (one of
    `compare.VARIANTS`) over every rank of the job; one more step on a fresh copy is counted
    apart, so that counting does not slow the timed steps."""
    group = dist.group.WORLD
    model, loss_fn, gather = build(variant, cfg.new_model(), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    x, y = cfg.data()  # the whole batch on every rank
    times = []
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = step(model, optimizer, loss_fn, x, y)
        if cfg.cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    state = local_state_bytes(model, optimizer)
    params = {k: v.to("cpu") for k, v in gather(model).items()}
    fresh, fresh_loss, _ = build(variant, cfg.new_model(), group)
    fresh_step = lambda: step(fresh, torch.optim.AdamW(fresh.parameters(), lr=cfg.lr),  # noqa: E731
                              fresh_loss, x, y)
    activations = None
    with CommCounter() as comm:
        if variant.startswith("dtensor"):
            fresh_step()  # its parameters are DTensors, which lesson 01's log cannot key
        else:
            _, activations = peak_activations(fresh, fresh_step, ignore=(x, y))
    return RowResult(loss.item(), params, state, round(comm.bus_bytes()), statistics.median(times),
                     activations)


def local_state_bytes(model, optimizer):
    """Bytes of this rank's parameters, gradients and optimizer state (DTensors: their shards)."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard
    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [local(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return storage_bytes(tensors)
