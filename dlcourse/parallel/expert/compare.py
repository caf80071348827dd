"""The expert-parallel variants side by side (lesson 09; `benchmarks/expert.py`): the
from-scratch dispatch or torch's `all_to_all_single_autograd`, experts by a loop or one grouped
GEMM, and one process on the whole batch; one AdamW step each, timed in one job.

    time_variants(config, batch, group, rounds=5)   # {variant: median seconds per step}
    communication_share(config, batch, group)       # an EP step beside its collectives alone

How much of an EP step is communication: `CommCounter` records one step's collectives (count
exchange, dispatch and combine forward and backward, the counts' all-gather, the dense
gradients' all-reduces); `replay` runs the same ops with the same byte sizes, in the same order,
with no compute around them. Their time against the step's is the share the collectives take
(an upper bound on what they cost the step: alone they do not overlap anything, and a rank that
waits for a slower one inside a collective is counted in the step but not in the replay).
"""

import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
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


def agreed_sizes(records, group):
    """Each recorded collective's byte size, the largest over the group's ranks: an uneven
    all-to-all sends different sizes from different ranks, and a replay must agree on one."""
    sizes = torch.tensor([rec.nbytes for rec in records], dtype=torch.int64)
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX, group=group)
    return [(rec.op, int(n)) for rec, n in zip(records, sizes)]


def replay(calls, group):
    """Run each (op, nbytes) collective again on float32 zeros of that size, in order: the
    all-to-alls with even splits (on a tiny model the time is mostly the per-call cost)."""
    ep = dist.get_world_size(group)
    for op, nbytes in calls:
        n = -(-nbytes // 4 // ep) * ep  # elements, a multiple of ep
        if op == "all_to_all":
            dist.all_to_all_single(torch.empty(n), torch.zeros(n), group=group)
        elif op == "all_reduce":
            dist.all_reduce(torch.zeros(n), group=group)
        elif op == "all_gather":
            dist.all_gather([torch.empty(n // ep) for _ in range(ep)], torch.zeros(n // ep),
                            group=group)
        else:
            raise ValueError(f"replay has no rule for {op!r}")


def communication_share(config, batch, group, rounds=5, lr=1e-3, seed=0):
    """{"step": median seconds of one EP AdamW step (scratch dispatch, expert loop),
    "collectives": median seconds of that step's collectives replayed alone, "calls": {op:
    count}}, timed in alternation on this rank; `batch` the whole (inputs, targets)."""
    model = expert_parallel(MoEGPT(config, seed), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    x, y = shard_batch(batch, group)
    ep_step(model, optimizer, x, y, group)  # warm-up
    with CommCounter() as comm:
        ep_step(model, optimizer, x, y, group)
    calls = agreed_sizes(comm.records, group)
    times = {"step": [], "collectives": []}
    for r in range(rounds + 1):
        for what in times:
            dist.barrier(group=group)
            start = time.perf_counter()
            if what == "step":
                ep_step(model, optimizer, x, y, group)
            else:
                replay(calls, group)
            if r:
                times[what].append(time.perf_counter() - start)
    ops = [op for op, _ in calls]
    return {**{k: statistics.median(t) for k, t in times.items()},
            "calls": {op: ops.count(op) for op in dict.fromkeys(ops)}}
