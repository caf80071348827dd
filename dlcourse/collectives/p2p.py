"""The point-to-point pieces every collective of lesson 02 is built from.

A collective here is a schedule of messages: at each step a rank sends one tensor and receives
another. This module holds what every schedule needs: where this rank sits in its `group`, who its
neighbours are, one exchange of messages, and how two partial results combine (`ReduceOp`).
"""

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

# How a received partial result combines with this rank's own: fn(mine, received, out=...).
# AVG reduces like SUM and divides by the group size once, on the final result.
COMBINE = {
    ReduceOp.SUM: torch.add,
    ReduceOp.AVG: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
}


def rank_in(group, who):
    """(rank, world_size) of this process within `group` (None: the default group).

    `who` names the caller for the error a rank outside the group gets.
    """
    group = group or dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        members = dist.get_process_group_ranks(group)
        raise ValueError(
            f"{who}: rank {dist.get_rank()} is not in the group (its ranks are {members}). "
            "Call it only on the group's own ranks, e.g. `if dist.get_rank() in ranks: ...`."
        )
    return rank, dist.get_world_size(group)


def global_rank(group, group_rank):
    """The rank that torch's send/recv expect (numbered in the default group) of `group_rank`."""
    return dist.get_global_rank(group or dist.group.WORLD, group_rank)


def ring_neighbours(rank, world_size, group=None):
    """(right, left) as global ranks: a ring sends to rank + 1 and receives from rank - 1."""
    right = global_rank(group, (rank + 1) % world_size)
    left = global_rank(group, (rank - 1) % world_size)
    return right, left


def exchange(send, recv, send_to, recv_from, group=None):
    """One step of a schedule: send `send` to `send_to` while receiving `recv` from `recv_from`.

    Both messages are posted before either is waited for. With blocking `dist.send` first on every
    rank of a ring, each rank would wait for a neighbour that is itself waiting: a deadlock.
    """
    ops = [
        dist.P2POp(dist.isend, send, send_to, group),
        dist.P2POp(dist.irecv, recv, recv_from, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def combine_into(out, mine, received, op):
    """out = mine (op) received, elementwise; `out` may be `mine` or `received` itself."""
    COMBINE[op](mine, received, out=out)


def finish(result, op, world_size):
    """The last touch of a reduction: AVG divides the sum by the number of ranks."""
    if op == ReduceOp.AVG:
        result.div_(world_size)


def check_op(op, who):
    if op not in COMBINE:
        names = ", ".join(str(o).split(".")[-1] for o in COMBINE)
        raise ValueError(f"{who}: op {op} is not supported here; use one of ReduceOp.{{{names}}}")


def check_contiguous(tensor, what, who):
    if not tensor.is_contiguous():
        raise ValueError(
            f"{who}: {what} is not contiguous; messages are sent from and received into "
            "contiguous memory (torch's own collectives need it too). Pass `t.contiguous()`."
        )


def scratch(numel, like):
    """A flat buffer for received messages, with the dtype and device of `like`."""
    return torch.empty(numel, dtype=like.dtype, device=like.device)


def nbytes_of(value):
    """Bytes of a tensor or of the tensors in a (nested) list."""
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(v) for v in value)
    return value.numel() * value.element_size()
