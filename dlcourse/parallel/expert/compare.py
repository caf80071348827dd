"""The expert-parallel variants side by side (lesson 09; `benchmarks/expert_parallel.py`): the
from-scratch dispatch or torch's `all_to_all_single_autograd`, experts by a loop or one grouped
GEMM, and one process on the whole batch; one AdamW step each, timed in one job.

    time_variants(config, batch, group, rounds=5)   # {variant: median seconds per step}
"""

import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.models import MoEGPT, moe_loss
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.expert.parallelize import average_gradients, expert_parallel

ONE_PROCESS = "one process"
# name -> (dispatch, grouped GEMM for the experts)
VARIANTS = {
    "scratch, loop": ("scratch", False),
    "torch a2a, loop": ("torch", False),
    "scratch, grouped_mm": ("scratch", True),
    "torch a2a, grouped_mm": ("torch", True),
}


def ep_step(model, optimizer, x, y, group):
    optimizer.zero_grad()
    loss = moe_loss(model, model(x), y)
    loss.backward()
    average_gradients(model, group)
    optimizer.step()
    return loss


def one_process_step(model, optimizer, x, y, group):
    """Rank 0 trains on the whole batch alone while the others wait in a barrier, so the step
    is timed with the machine's cores not shared with the other ranks' work."""
    if dist.get_rank(group) == 0:
        optimizer.zero_grad()
        moe_loss(model, model(x), y).backward()
        optimizer.step()
    dist.barrier(group=group)


def time_variants(config, batch, group, variants=(*VARIANTS, ONE_PROCESS), rounds=5, steps=2,
                  lr=1e-3, seed=0):
    """Median seconds per AdamW step of each variant, on every rank; rounds rotate the order so
    a slow spell on a shared machine hits every variant alike; round 0 is a warm-up. `batch`:
    the whole (inputs, targets); expert parallelism gets this rank's shard. The one-process
    time is rank 0's (the others' entry is the time they waited for it)."""
    x, y = shard_batch(batch, group)
    models, runs = {}, {}
    for v in variants:
        if v == ONE_PROCESS:
            models[v], runs[v] = MoEGPT(config, seed), (one_process_step, *batch)
        else:
            models[v] = expert_parallel(MoEGPT(config, seed), group, *VARIANTS[v])
            runs[v] = (ep_step, x, y)
    optimizers = {v: torch.optim.AdamW(m.parameters(), lr=lr) for v, m in models.items()}
    times = {v: [] for v in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            step, *data = runs[v]
            for _ in range(steps):
                dist.barrier(group=group)  # every variant starts with all ranks ready
                start = time.perf_counter()
                step(models[v], optimizers[v], *data, group)
                if r:
                    times[v].append(time.perf_counter() - start)
    return {v: statistics.median(t) for v, t in times.items()}
