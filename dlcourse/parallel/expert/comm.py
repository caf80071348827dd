"""The communication of expert parallelism as tiny pieces (lesson 09, `lessons/09_experts.ipynb`).

    exchange_counts   forward: all-to-all of the counts per expert (no gradient): each rank
                      learns how many tokens every rank will send to each of its experts
    all_to_all        forward: all-to-all of rows with uneven split sizes (send in_splits[r]
                      rows to rank r, receive out_splits[r] from it)
                      backward: the reverse all-to-all (out_splits and in_splits swapped)
    torch_all_to_all  the same with torch's `all_to_all_single_autograd`
    GroupCounts       the whole batch's counts per (choice, expert), and those of earlier
                      ranks, from one all-gather: what `MoE` needs for its capacity rule and
                      load-balance loss to be the one-process ones

Why the backward is the reverse all-to-all: the forward is a permutation of rows across ranks
(row i of rank s's input becomes row j of rank d's output). The gradient of a row goes back to
where the row came from: rank d sends it to rank s, in the same order: the same exchange with
the split sizes swapped. Like lesson 04's f and g, each direction is the other's adjoint.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


class AllToAll(torch.autograd.Function):
    """Rows of x (M, ...) -> (sum(out_splits), ...); backward sends each row's gradient back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


def all_to_all(x, out_splits, in_splits, group):
    """Send in_splits[r] consecutive rows of x to rank r, receive out_splits[r] from rank r,
    stacked in rank order; differentiable (backward: the reverse all-to-all)."""
    return AllToAll.apply(x, out_splits, in_splits, group)


def torch_all_to_all(x, out_splits, in_splits, group):
    """`all_to_all` with torch's functional collective, whose autograd formula (torch 2.13:
    `_functional_collectives.all_to_all_single_backward`) is the all-to-all with the splits
    swapped. In torch 2.13 `all_to_all_single_autograd` is a wrapper that calls
    `all_to_all_single`, whose op now carries that formula; neither has a public name (the
    public `torch.distributed.nn.functional.all_to_all_single` is deprecated in their favour)."""
    return funcol.all_to_all_single_autograd(x, out_splits, in_splits, group)


def _all_to_all(x, out_splits, in_splits, group):
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def exchange_counts(counts, group):
    """counts (E,): this rank's tokens for every expert, experts dealt out to ranks in blocks of
    E/ep -> (ep, E/ep): row s = what rank s sends to each of this rank's experts."""
    ep = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)  # E/ep to each rank
    return received.view(ep, -1)


class GroupCounts:
    """`MoE.batch_counts` for a group whose ranks hold consecutive shards of one batch:
    (k, E) counts here -> (the group's total, the sum over ranks before this one)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, counts):
        ep, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        everyone = [torch.empty_like(counts) for _ in range(ep)]
        dist.all_gather(everyone, counts.contiguous(), group=self.group)  # ep x (k, E)
        return sum(everyone), sum(everyone[:rank], torch.zeros_like(counts))
