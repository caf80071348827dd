"""The runs whose values lesson 02's figures show: each collective on real ranks, before and after.

Values are chosen so that a number says where it came from: rank r's element i is (i + 1) x 10^r,
so rank 0 holds 1 2 3 4, rank 2 holds 100 200 300 400, and a sum over all four ranks of element 1
reads 2222. `contributors(value)` reads the ranks back out of the digits, which is how the figures
colour a cell (`dlcourse.plots.collectives`). Exact in float64 for up to 9 ranks.
"""

import torch
import torch.distributed as dist

from dlcourse.collectives.p2p import rank_in
from dlcourse.collectives.ring import ring_all_reduce_steps


def rank_values(rank, numel):
    """Rank `rank`'s tensor: element i is (i + 1) x 10^rank, in float64."""
    return torch.arange(1, numel + 1, dtype=torch.float64) * 10.0**rank


def contributors(value):
    """The ranks whose values were added into `value`: the positions of its non-zero digits."""
    digits = str(int(round(abs(value))))[::-1]
    return [rank for rank, d in enumerate(digits) if d != "0"]


def _broadcast(rank, n):
    t = rank_values(rank, n)
    before = t.clone()
    dist.broadcast(t, src=0)
    return before, t


def _reduce(rank, n):
    t = rank_values(rank, n)
    before = t.clone()
    dist.reduce(t, dst=0)
    return before, t if rank == 0 else None  # torch leaves the other ranks' tensors undefined


def _all_reduce(rank, n):
    t = rank_values(rank, n)
    before = t.clone()
    dist.all_reduce(t)
    return before, t


def _reduce_scatter(rank, n):
    t = rank_values(rank, n)
    out = torch.empty(1, dtype=t.dtype)
    dist.reduce_scatter(out, list(t.split(1)))  # element c of every rank, summed, lands on rank c
    return t, out


def _all_gather(rank, n):
    mine = rank_values(rank, n)[rank : rank + 1]  # one element each: (rank + 1) x 10^rank
    gathered = [torch.empty(1, dtype=mine.dtype) for _ in range(n)]
    dist.all_gather(gathered, mine)
    return mine, torch.cat(gathered)


def _scatter(rank, n):
    t = rank_values(rank, n)
    out = torch.empty(1, dtype=t.dtype)
    dist.scatter(out, list(t.split(1)) if rank == 0 else None, src=0)
    return (t if rank == 0 else None), out


def _gather(rank, n):
    mine = rank_values(rank, n)[rank : rank + 1]
    gathered = [torch.empty(1, dtype=mine.dtype) for _ in range(n)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    return mine, (torch.cat(gathered) if rank == 0 else None)


def _all_to_all(rank, n):
    t = rank_values(rank, n)
    received = [torch.empty(1, dtype=t.dtype) for _ in range(n)]
    dist.all_to_all(received, list(t.split(1)))  # element c of rank r goes to rank c, slot r
    return t, torch.cat(received)


# op -> fn(rank, world_size) -> (before, after): this rank's tensor before and after torch's op,
# or None where the rank has no tensor (scatter's non-roots) or torch leaves it undefined.
SEMANTICS = {
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather,
    "scatter": _scatter,
    "gather": _gather,
    "all_to_all": _all_to_all,
}


def before_after(op):
    """Run on every rank: (before, after) of torch's `op` on this rank, as lists of floats."""
    if op not in SEMANTICS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(SEMANTICS)}")
    before, after = SEMANTICS[op](dist.get_rank(), dist.get_world_size())
    return _as_list(before), _as_list(after)


def ring_trace(numel=None, group=None):
    """Run on every rank: the ring all-reduce of `rank_values`, as what this rank holds.

    Returns [(label, sent chunk, received chunk, values)], the first entry the start (chunk
    indices None), then one entry per step of `ring_all_reduce_steps`.
    """
    rank, world_size = rank_in(group, "ring_trace")
    tensor = rank_values(rank, numel or world_size)
    trace = [("start", None, None, tensor.tolist())]
    for s in ring_all_reduce_steps(tensor, group=group):
        trace.append((f"{s.phase} step {s.step + 1}", s.sent, s.received, tensor.tolist()))
    return trace


def _as_list(t):
    return None if t is None else t.tolist()
