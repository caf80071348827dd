"""Keys and values by all-gather (lesson 08, `lessons/08_context_parallel.ipynb`), the ring's
alternative.

Every rank all-gathers K and V (one collective of 2·b·s·h values, the ring's forward bytes), then
attends its s/cp queries to all s keys at once, and saves the gathered K and V for backward.
Backward: the gradient of an all-gather is a reduce-scatter; dK and dV of each rank's tokens are
summed over the ranks whose queries saw them. Two passes over K/V-sized messages where the ring
makes three (the ring sends K/V again in backward), bought with memory: the whole K and V sit on
every rank (2·b·s·h values saved, where the ring keeps only its own 2·b·s·h/cp), and no compute
can start on a remote block before the gather ends.

Torch's experimental `context_parallel` also gathers by default (torch 2.13,
`torch/distributed/tensor/experimental/_context_parallel/_attention.py`: `_cp_options.rotate_method`
is `_RotateMethod.ALL_GATHER`), but chooses memory over bytes: its `_AllGatherRotater` gathers
once per pass, attends to the local block while the gather runs and drops the gathered buffer
after the forward; its backward gathers K/V again and passes the dK/dV accumulators around the
ring (`_templated_ring_attention_backward`, an `_AllToAllRotater`), not a reduce-scatter.
"""

import torch
import torch.distributed as dist

from dlcourse.parallel.context.blockwise import block_attention


class AllGatherKV(torch.autograd.Function):
    """(2, b, a, s/cp, d) stacked K and V -> (2, b, a, s, d), tokens in rank order;
    backward: reduce-scatter of the gradient back to this rank's tokens."""

    @staticmethod
    def forward(ctx, kv, group):
        ctx.group = group
        cp = dist.get_world_size(group)
        two, b, a, n, d = kv.shape
        out = kv.new_empty((cp * two, b, a, n, d))  # all_gather_single concatenates along dim 0
        dist.all_gather_single(out, kv.contiguous(), group=group)
        return out.view(cp, two, b, a, n, d).permute(1, 2, 3, 0, 4, 5).reshape(two, b, a, cp * n, d)

    @staticmethod
    def backward(ctx, grad):
        cp = dist.get_world_size(ctx.group)
        two, b, a, s, d = grad.shape
        full = grad.reshape(two, b, a, cp, s // cp, d).permute(3, 0, 1, 2, 4, 5)
        full = full.reshape(cp * two, b, a, s // cp, d)  # rank r's tokens: rows 2r, 2r + 1
        out = grad.new_empty((two, b, a, s // cp, d))
        dist.reduce_scatter_single(out, full, group=ctx.group)
        return out, None


def allgather_attention(q, k, v, group, layout, causal=True):
    """This rank's queries (b, a, s/cp, d) against every rank's keys and values, gathered."""
    cp = dist.get_world_size(group)
    k_all, v_all = AllGatherKV.apply(torch.stack([k, v]), group)  # (b, a, s, d) each
    k_pos = torch.cat([layout.positions(r, q.device) for r in range(cp)])  # (s,): rank order
    q_pos = layout.positions(dist.get_rank(group), q.device)
    return block_attention(q, k_all, v_all, q_pos, k_pos, causal)
