"""`ExpertParallelExperts`: a rank's E/ep experts, fed with every rank's tokens (lesson 09).

It replaces an `MoE`'s `Experts` and keeps its interface, forward(x, counts) with x (M, h) this
rank's kept assignments sorted by expert and counts (E,), so the `MoE` layer runs unchanged. Rank
r holds experts r·E/ep .. (r+1)·E/ep - 1 (blocks of E/ep, in rank order). One forward:

    1. exchange the counts      all-to-all of counts (E,) -> (ep, E/ep) received
    2. dispatch                 all-to-all of x: send splits = this rank's counts summed per
                                destination rank, receive splits = received counts per source
    3. sort by local expert     received rows come (source, expert); experts want (expert, source)
    4. run the local experts    a loop, or one grouped GEMM
    5. un-sort, combine         the inverse permutation, then the reverse all-to-all: each rank
                                gets its own rows back in the order it sent them
"""

import torch
import torch.distributed as dist

from dlcourse.moe_experts import Experts
from dlcourse.parallel.expert.comm import all_to_all, exchange_counts, torch_all_to_all

ALL_TO_ALL = {"scratch": all_to_all, "torch": torch_all_to_all}  # name -> the dispatch function


def sort_by_local_expert(received):
    """received (ep, E/ep) counts -> (R,) permutation that reorders the R received rows, which
    arrive grouped by source then expert, into groups by expert then source (stable). On
    received's device (on nccl the counts are on the GPU: so are the rows they index)."""
    ep, n_local = received.shape
    local = torch.arange(n_local, device=received.device)  # (E/ep,)
    expert_of_row = local.repeat(ep).repeat_interleave(received.flatten())  # (R,)
    return torch.sort(expert_of_row, stable=True).indices


def inverse_permutation(order):
    """inverse[order[i]] = i: y[inverse] puts rows computed in `order` back where they were."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


class ExpertParallelExperts(Experts):
    """This rank's block of an `Experts`' E experts (parameter names unchanged), run on the
    tokens that every rank of `group` routes to them. `received` holds the last forward's
    (ep, E/ep) counts: tokens from each source rank for each local expert."""

    def __init__(self, experts, group, all_to_all="scratch", grouped_mm=False):
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        n_local = experts.n_experts // ep
        torch.nn.Module.__init__(self)  # not Experts.__init__: the weights are `experts`' own
        self.n_experts, self.grouped_mm = n_local, grouped_mm
        self.fc = experts.fc.narrow(rank * n_local, n_local)  # (E/ep, f, h)
        self.proj = experts.proj.narrow(rank * n_local, n_local)  # (E/ep, h, f)
        self.group, self.all_to_all = group, ALL_TO_ALL[all_to_all]
        self.received = None

    def forward(self, x, counts):
        ep = dist.get_world_size(self.group)
        self.received = received = exchange_counts(counts, self.group)  # (ep, E/ep)
        send = counts.view(ep, -1).sum(dim=1).tolist()  # rows to each rank
        recv = received.sum(dim=1).tolist()  # rows from each rank
        x = self.all_to_all(x, recv, send, self.group)  # (R, h), by (source, expert)
        order = sort_by_local_expert(received)
        y = super().forward(x[order], received.sum(dim=0))  # (R, h), by (expert, source)
        y = y[inverse_permutation(order)]  # back to (source, expert)
        return self.all_to_all(y, send, recv, self.group)  # (M, h), this rank's rows
