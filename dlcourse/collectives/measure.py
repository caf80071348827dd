"""Timing collectives on real ranks, for lesson 02's curves and `benchmarks/collectives.py`.

    times = dlcourse.launch(time_ops, ["ring all_reduce", "torch all_reduce"], sizes)[0]

Every rank runs the same ops on the same float32 sizes; the ops take turns within each repeat, so
a burst of load from elsewhere on the machine slows all of them alike. An op's time for one repeat
is the slowest rank's (a collective is done when its last rank is), and the reported time is the
median over repeats.
"""

import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.collectives.p2p import exchange, rank_in, ring_neighbours
from dlcourse.collectives.ring import ring_all_reduce
from dlcourse.collectives.tree import naive_all_reduce, tree_all_reduce


def ring_step(tensor, spare, group=None):
    """One step of a ring on every rank at once: send `tensor` right, receive `spare` from the
    left. Its time for b bytes is what the alpha-beta model calls alpha + b * beta."""
    rank, world_size = rank_in(group, "ring_step")
    right, left = ring_neighbours(rank, world_size, group)
    exchange(tensor, spare, right, left, group)


# name -> fn(tensor, spare, group): the op that is timed. `spare` is a tensor like `tensor`,
# allocated once, for ops that need somewhere to receive, so no time includes allocating memory.
OPS = {
    "ring step": ring_step,
    "ring all_reduce": lambda t, spare, group: ring_all_reduce(t, group=group),
    "naive all_reduce": lambda t, spare, group: naive_all_reduce(t, group=group),
    "tree all_reduce": lambda t, spare, group: tree_all_reduce(t, group=group),
    "torch all_reduce": lambda t, spare, group: dist.all_reduce(t, group=group),
}


def time_ops(names, sizes, repeats=3, group=None, warmup=1, summary=statistics.median,
             clock=time.perf_counter):
    """Run on every rank: {name: [summary(seconds of each repeat), one per size in `sizes`]}.

    sizes in bytes; tensors are float32 zeros, so sums stay zero however often they repeat.
    summary=list keeps every repeat (the benchmark pairs repeats to compare ops).
    clock=time.process_time measures CPU seconds (this rank's threads) instead of wall seconds.
    """
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise ValueError(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    rank_in(group, "time_ops")
    times = torch.zeros(len(names), len(sizes), repeats, dtype=torch.float64)
    for j, nbytes in enumerate(sizes):
        tensor = torch.zeros(max(1, nbytes // 4))
        spare = torch.zeros_like(tensor)
        for repeat in range(-warmup, repeats):
            for i, name in enumerate(names):
                seconds = _time_once(OPS[name], tensor, spare, group, clock)
                if repeat >= 0:
                    times[i, j, repeat] = seconds
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's time
    return {name: [summary(times[i, j].tolist()) for j in range(len(sizes))]
            for i, name in enumerate(names)}


def _time_once(fn, tensor, spare, group, clock):
    dist.barrier(group=group)  # start together, so no rank's time includes waiting for another
    start = clock()
    fn(tensor, spare, group)
    return clock() - start
