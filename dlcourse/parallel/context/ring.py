"""Ring attention (lesson 08, `lessons/08_context_parallel.ipynb`; Liu et al. 2023, "Ring
Attention with Blockwise Transformers"; the zig-zag layout of `layout.py` balances the causal
mask's work).

Every rank of the group keeps its queries. The key/value blocks travel around the ring (rank r
sends to r + 1 and receives from r - 1, lesson 02's ring): at step j rank r holds the block of
rank r - j, computes its queries against it (`blockwise.attention_block`, chunk by chunk, skipping
pairs the causal mask hides entirely) and merges the result into its running output with the
online softmax. The send/recv of the next block is posted before the compute and waited for
after it, so the two can overlap. After cp steps every query has seen every key.

Backward (one autograd Function with the forward): K/V go around the ring again. Each rank adds
its queries' part of dK and dV for the block it holds to an accumulator that travels one step
behind the block (it leaves after the compute), so that after cp - 1 hops it arrives home at the
block's owner, which adds its own part. Per rank and direction, cp - 1 messages of 2·b·(s/cp)·h
values each way in the forward (K and V), and as many again for K/V and for dK/dV in the backward.
"""

import torch
import torch.distributed as dist

from dlcourse.collectives.p2p import ring_neighbours
from dlcourse.parallel.context.blockwise import merge, visible
from dlcourse.parallel.context.kernels import KERNELS

KV_TAG, GRAD_TAG = 0, 1  # the two streams from left to right in the backward, kept apart


def start_exchange(send, recv, right, left, group, tag):
    """Post `send` to the right and a receive into `recv` from the left; return the works to
    wait for. Both are non-blocking, so every rank posting at once cannot deadlock."""
    ops = [dist.P2POp(dist.isend, send, right, group, tag),
           dist.P2POp(dist.irecv, recv, left, group, tag)]
    return dist.batch_isend_irecv(ops)


def wait(works):
    for work in works:
        work.wait()


def _pairs(layout, rank, src, causal, device):
    """(query chunk i, key chunk j, their positions) for this rank's queries against rank src's
    keys, the pairs the mask hides entirely left out. Chunks are the layout's: 1 a rank, or 2."""
    n = len(layout.chunks(rank))
    q_pos = layout.positions(rank, device).chunk(n)
    k_pos = layout.positions(src, device).chunk(n)
    return [(i, j, q_pos[i], k_pos[j]) for i in range(n) for j in range(n)
            if visible(q_pos[i], k_pos[j], causal) != "none"]


class RingAttention(torch.autograd.Function):
    """q, k, v (b, a, s/cp, d) of this rank's tokens in `layout` -> the attention output
    (b, a, s/cp, d) of its queries over the whole sequence."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal, kernel):
        block_forward = KERNELS[kernel][0]
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        right, left = ring_neighbours(rank, cp, group)
        n = len(layout.chunks(rank))
        q_chunks = q.chunk(n, dim=2)  # n views (b, a, s/(n·cp), d)
        partial = [None] * n  # per query chunk: (out, lse) merged so far
        kv = torch.stack([k, v])  # (2, b, a, s/cp, d): one message per step
        for step in range(cp):
            src = (rank - step) % cp  # whose block we hold now
            works, kv_next = [], None
            if step < cp - 1:  # post the next block's transfer before computing on this one
                kv_next = torch.empty_like(kv)
                works = start_exchange(kv, kv_next, right, left, group, KV_TAG)
            k_chunks, v_chunks = kv[0].chunk(n, dim=2), kv[1].chunk(n, dim=2)
            for i, j, q_pos, k_pos in _pairs(layout, rank, src, causal, q.device):
                block = block_forward(q_chunks[i], k_chunks[j], v_chunks[j], q_pos, k_pos, causal)
                partial[i] = block if partial[i] is None else merge(*partial[i], *block)
            wait(works)
            kv = kv_next
        out = torch.cat([o for o, _ in partial], dim=2)  # (b, a, s/cp, d)
        lse = torch.cat([l for _, l in partial], dim=2)  # (b, a, s/cp)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout, ctx.causal, ctx.kernel = group, layout, causal, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, layout, causal = ctx.group, ctx.layout, ctx.causal
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        right, left = ring_neighbours(rank, cp, group)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # (b, a, s/cp): rowsum(dO ∘ O)
        dq = torch.zeros_like(q)
        kv, own, travelling = torch.stack([k, v]), None, None
        for step in range(cp):
            src = (rank - step) % cp
            works, kv_next = [], None
            if step < cp - 1:
                kv_next = torch.empty_like(kv)
                works = start_exchange(kv, kv_next, right, left, group, KV_TAG)
            dq_part, dkv = _block_grads(dout, out, delta, lse, q, kv, layout, rank, src, causal,
                                        KERNELS[ctx.kernel][1])
            dq += dq_part
            if step == 0:
                own = dkv  # this rank's own block: its part stays home
            else:
                travelling = _pass_on(dkv, travelling, right, left, group)
            wait(works)
            kv = kv_next
        if travelling is not None:  # the accumulator of our own block, home after cp - 1 hops
            wait(travelling[0])
            own = own + travelling[1]
        return dq, own[0], own[1], None, None, None, None


def _pass_on(dkv, travelling, right, left, group):
    """Add this rank's part of dK/dV to the block's accumulator, which came from the left (none
    at the block's first hop), and send it on to the right; post the receive of the next one.
    Returns (works, the buffer the next accumulator lands in, the message being sent)."""
    if travelling is not None:
        works, received, _ = travelling
        wait(works)  # also the send of the last message: its buffer may go now
        dkv = dkv + received
    received = torch.empty_like(dkv)
    return start_exchange(dkv, received, right, left, group, GRAD_TAG), received, dkv


def _block_grads(dout, out, delta, lse, q, kv, layout, rank, src, causal, block_backward):
    """This rank's queries against rank src's block: dq (b, a, s/cp, d) and the queries' part
    of that block's dK and dV, stacked (2, b, a, s/cp, d)."""
    n = len(layout.chunks(rank))
    dq = torch.zeros_like(q)
    dkv = torch.zeros_like(kv)
    per_chunk = [t.chunk(n, dim=2) for t in (dout, out, delta, lse, q, dq)]
    k_chunks, v_chunks = kv[0].chunk(n, dim=2), kv[1].chunk(n, dim=2)
    dk_chunks, dv_chunks = dkv[0].chunk(n, dim=2), dkv[1].chunk(n, dim=2)
    for i, j, q_pos, k_pos in _pairs(layout, rank, src, causal, q.device):
        dout_i, out_i, delta_i, lse_i, q_i, dq_i = (t[i] for t in per_chunk)
        dq_ij, dk_ij, dv_ij = block_backward(dout_i, out_i, delta_i, lse_i, q_i, k_chunks[j],
                                             v_chunks[j], q_pos, k_pos, causal)
        dq_i += dq_ij  # views: these write into dq and dkv
        dk_chunks[j].add_(dk_ij)
        dv_chunks[j].add_(dv_ij)
    return dq, dkv


def ring_attention(q, k, v, group, layout, causal=True, kernel="explicit"):
    """Attention of this rank's queries over the whole sequence, K/V passed around the ring:
    q, k, v (b, a, s/cp, d) hold this rank's tokens as `layout` places them. kernel: how one
    block is computed, a key of `kernels.KERNELS` ("explicit", or "fused" on CPU)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; one of {sorted(KERNELS)}")
    if q.size(2) * layout.cp != layout.seq_len or dist.get_world_size(group) != layout.cp:
        raise ValueError(f"ring_attention: {layout.cp} ranks of {q.size(2)} tokens do not make "
                         f"the layout's {layout.seq_len} tokens on a group of "
                         f"{dist.get_world_size(group)}")
    return RingAttention.apply(q, k, v, group, layout, causal, kernel)
