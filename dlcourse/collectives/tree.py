"""Broadcast and reduce along a binomial tree, and the naive all-reduce, from send/recv (lesson 02).

Binomial tree: number the ranks from the root (position 0). In round k = 0, 1, ... every rank
that already holds the data (positions below 2^k) sends it to the rank 2^k positions further on.
The holders double each round, so broadcast takes ceil(log2 n) rounds of the whole tensor.
Reduce runs the same tree backwards, leaves first. This is the textbook tree, not nccl's: nccl
pipelines small pieces of the tensor through two complementary binary trees, so its links carry
about as many bytes as a ring's, where this one sends the whole tensor every round.

Naive all-reduce: every rank sends its tensor to the root, which reduces them one after another
and sends the result back to each rank: 2(n - 1) messages of the whole tensor through the root's
one link. It is the picture to keep in mind when the ring's 2(n-1)/n looks like magic.

Signatures and in-place contracts are torch's: `src`/`dst` are ranks of the default group, as in
`dist.broadcast(tensor, src, group)`; `group` is the group to run on (None: the default group).
"""

import torch.distributed as dist

from dlcourse.collectives.counter import recorded
from dlcourse.collectives.p2p import (
    check_contiguous,
    check_op,
    combine_into,
    finish,
    global_rank,
    nbytes_of,
    rank_in,
    scratch,
)

ReduceOp = dist.ReduceOp


def tree_broadcast(tensor, src, group=None):
    """Like `dist.broadcast`: every rank's `tensor` becomes rank `src`'s, in ceil(log2 n) rounds."""
    who = "tree_broadcast"
    rank, world_size = rank_in(group, who)
    root = _root_in(group, src, "src", who)
    check_contiguous(tensor, "tensor", who)
    me = (rank - root) % world_size  # position counted from the root
    with recorded("broadcast", nbytes_of(tensor), world_size, "tree"):
        distance = 1  # round k: positions below `distance` = 2^k hold the data
        while distance < world_size:
            if me < distance and me + distance < world_size:
                dist.send(tensor, _at(me + distance, root, world_size, group), group)
            elif distance <= me < 2 * distance:
                dist.recv(tensor, _at(me - distance, root, world_size, group), group)
            distance *= 2


def tree_reduce(tensor, dst, op=ReduceOp.SUM, group=None):
    """Like `dist.reduce`: rank `dst`'s `tensor` becomes the reduction of every rank's.

    torch leaves the other ranks' tensors undefined (gloo uses them as scratch); here they are
    left unchanged.
    """
    who = "tree_reduce"
    rank, world_size = rank_in(group, who)
    root = _root_in(group, dst, "dst", who)
    check_op(op, who)
    check_contiguous(tensor, "tensor", who)
    me = (rank - root) % world_size
    with recorded("reduce", nbytes_of(tensor), world_size, "tree"):
        _reduce_up_the_tree(tensor, me, root, op, world_size, group)
        if me == 0:
            finish(tensor, op, world_size)


def _reduce_up_the_tree(tensor, me, root, op, world_size, group):
    """Receive from each child, leaves first, then send the partial result to the parent."""
    # The root reduces into `tensor`; another rank with children into a copy, so its own
    # `tensor` is not changed. A leaf sends `tensor` as it is.
    partial = tensor
    received = None
    distance = 1
    while distance < world_size:
        if me % (2 * distance) == distance:  # my parent is `distance` positions back: done
            dist.send(partial, _at(me - distance, root, world_size, group), group)
            break
        # Still here: `me` is a multiple of 2 x distance, so a parent of this round.
        if me + distance < world_size:  # its child `distance` positions on, with its subtree
            if received is None:
                received = scratch(tensor.numel(), tensor).view(tensor.shape)
                partial = tensor if me == 0 else tensor.clone()
            dist.recv(received, _at(me + distance, root, world_size, group), group)
            combine_into(partial, partial, received, op)
        distance *= 2


def tree_all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """All-reduce as tree reduce to the group's first rank, then tree broadcast from it."""
    who = "tree_all_reduce"
    rank, world_size = rank_in(group, who)
    check_op(op, who)
    root = global_rank(group, 0)
    with recorded("all_reduce", nbytes_of(tensor), world_size, "tree"):
        tree_reduce(tensor, root, op, group)
        tree_broadcast(tensor, root, group)


def naive_all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """All-reduce through one root: everyone sends to it, it reduces and sends the result back."""
    who = "naive_all_reduce"
    rank, world_size = rank_in(group, who)
    check_op(op, who)
    check_contiguous(tensor, "tensor", who)
    root = global_rank(group, 0)
    with recorded("all_reduce", nbytes_of(tensor), world_size, "naive"):
        if rank != 0:
            dist.send(tensor, root, group)
            dist.recv(tensor, root, group)
            return
        received = scratch(tensor.numel(), tensor).view(tensor.shape)
        for peer in range(1, world_size):  # one message after another through the root's link
            dist.recv(received, global_rank(group, peer), group)
            combine_into(tensor, tensor, received, op)
        finish(tensor, op, world_size)
        for peer in range(1, world_size):
            dist.send(tensor, global_rank(group, peer), group)


def _root_in(group, root, name, who):
    """Group rank of the global rank `root`, with an error saying what to pass instead."""
    members = dist.get_process_group_ranks(group or dist.group.WORLD)
    if root not in members:
        raise ValueError(
            f"{who}: {name}={root} is not a rank of the group {members}; {name} is numbered in "
            "the default group, as in torch (for the group's first rank pass "
            "dist.get_global_rank(group, 0))."
        )
    return members.index(root)


def _at(position, root, world_size, group):
    """Global rank of the rank `position` places after the root."""
    return global_rank(group, (root + position) % world_size)
