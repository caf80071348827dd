"""DeepSpeed-Ulysses (lesson 08, `lessons/08_context_parallel.ipynb`; Jacobs et al. 2023,
"DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence
Transformer Models", Section 3).

Each rank holds s/cp tokens of q, k and v for all a heads. One all-to-all per tensor turns that
into all s tokens for a/cp heads; attention runs on whole sequences for those heads
(`blockwise.block_attention`, no s x s matrix kept); one all-to-all turns the output back into
s/cp tokens of every head. Four all-to-alls forward (q, k, v, out), each moving b·s·h/cp values
per rank (all but 1/cp of them to other ranks), and four backward, each the reverse of one.
Its limit: the heads are what is split, so cp must divide a, the query heads. With grouped-query
attention (fewer K/V heads than query heads, which the course GPT does not have) the K/V heads are
split too; where cp exceeds them, each K/V head is repeated cp / h_kv times before the all-to-all
(verl, `verl/models/transformers/monkey_patch.py`), so the K/V all-to-alls carry copies.
"""

import torch
import torch.distributed as dist

from dlcourse.parallel.context.blockwise import block_attention
from dlcourse.parallel.tensor.comm import Conjugate


def _seq_to_heads(x, group):
    """(b, a, s/cp, d) on every rank -> (b, a/cp, s, d): this rank's heads, every rank's tokens
    in rank order."""
    cp = dist.get_world_size(group)
    b, a, n, d = x.shape
    send = x.reshape(b, cp, a // cp, n, d).transpose(0, 1).contiguous()  # (cp, b, a/cp, n, d)
    recv = torch.empty_like(send)  # recv[r]: rank r's tokens of this rank's heads
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, a // cp, cp * n, d)


def _heads_to_seq(x, group):
    """(b, a/cp, s, d) -> (b, a, s/cp, d): the inverse of `_seq_to_heads`."""
    cp = dist.get_world_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, h, cp, s // cp, d).permute(2, 0, 1, 3, 4).contiguous()  # (cp, b, h, n, d)
    recv = torch.empty_like(send)  # recv[r]: rank r's heads of this rank's tokens
    dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, cp * h, s // cp, d)


def check_ulysses(n_heads, cp):
    """Refuse a head count Ulysses cannot split over cp ranks, with the arithmetic."""
    if n_heads % cp:
        raise ValueError(f"Ulysses splits the heads: cp {cp} does not divide n_heads {n_heads} "
                         f"({n_heads} / {cp} = {n_heads / cp:g}); use cp in "
                         f"{[c for c in range(1, n_heads + 1) if n_heads % c == 0]}, or the ring")


def ulysses_attention(q, k, v, group, layout, causal=True):
    """Attention over the whole sequence for q, k, v (b, a, s/cp, d) of this rank's tokens
    (placed by `layout`), with the heads split over the group in between."""
    cp = dist.get_world_size(group)
    check_ulysses(q.size(1), cp)
    positions = torch.cat([layout.positions(r, q.device) for r in range(cp)])  # (s,): rank order
    # (b, a/cp, s, d) each; an all-to-all's backward is the reverse one (lesson 04's Conjugate)
    qh, kh, vh = (Conjugate.apply(t, group, _seq_to_heads, _heads_to_seq) for t in (q, k, v))
    out = block_attention(qh, kh, vh, positions, positions, causal)  # (b, a/cp, s, d)
    return Conjugate.apply(out, group, _heads_to_seq, _seq_to_heads)  # (b, a, s/cp, d)
