"""Tensor-parallel layers (lesson 04, `lessons/04_tensor_parallel.ipynb`): each is built from the
plain layer it replaces and keeps only this rank's share of its weights. The communication is
`comm.py`'s f, g and the sequence-parallel pair; no layer calls a collective itself.

    ColumnParallelLinear    W split by output rows: y_r = x W_r^T, (..., out/t) on rank r
    RowParallelLinear       W split by input columns: y = sum_r x_r W_r^T, all-reduced (g)
    VocabParallelEmbedding  rows of the (V, h) table split by token id, partial lookups summed
    SequenceParallelLayerNorm  LayerNorm on a sequence shard, its weights' gradients summed (f)
    SequenceParallelPositions  the position embeddings of this rank's sequence shard

Every sharded parameter carries `tp_dim` and `tp_parts` (how `shard` cut it), so
`unshard` can put the whole tensor back together for the proofs.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.parallel.tensor.comm import (f, g, gather_last_dim, gather_sequence,
                                           reduce_scatter_sequence)


def shard(full, dim, rank, tp, parts=1):
    """Rank `rank`'s 1/tp of `full` along `dim`. With parts=3 (a fused q, k, v weight) each of
    the 3 parts is cut separately and the rank's pieces are stacked: [q_r; k_r; v_r]. Cutting the
    fused tensor into tp contiguous chunks would hand rank 0 all of q and part of k instead."""
    pieces = [part.chunk(tp, dim=dim)[rank] for part in full.chunk(parts, dim=dim)]
    return torch.cat(pieces, dim=dim).clone()


def unshard(shards, dim, parts=1):
    """The inverse of `shard`: every rank's shard, in rank order -> the full tensor."""
    per_part = [s.chunk(parts, dim=dim) for s in shards]  # [rank][part]
    return torch.cat([torch.cat([p[i] for p in per_part], dim=dim) for i in range(parts)], dim=dim)


def sharded_parameter(full, dim, group, parts=1):
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    p = nn.Parameter(shard(full.detach(), dim, rank, t, parts))
    p.tp_dim, p.tp_parts = dim, parts  # read by `unshard` through `full_parameters`
    return p


def replicated_parameter(full):
    return None if full is None else nn.Parameter(full.detach().clone())


class ColumnParallelLinear(nn.Module):
    """nn.Linear(in, out) with its output features split over the group: rank r holds rows
    W_r (out/t, in) and bias b_r. Input: the whole x (through f, whose backward sums the ranks'
    input gradients) or, with sequence_parallel, x's sequence shard (all-gathered).
    Output: (..., out/t), or the whole (..., out) with gather_output (an all-gather)."""

    def __init__(self, linear, group, parts=1, sequence_parallel=False, gather_output=False):
        super().__init__()
        self.group, self.sequence_parallel, self.gather_output = group, sequence_parallel, gather_output
        self.weight = sharded_parameter(linear.weight, 0, group, parts)  # (out/t, in)
        self.bias = None if linear.bias is None else sharded_parameter(linear.bias, 0, group, parts)

    def forward(self, x):
        x = gather_sequence(x, self.group) if self.sequence_parallel else f(x, self.group)
        y = F.linear(x, self.weight, self.bias)  # (..., out/t): this rank's output features
        return gather_last_dim(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """nn.Linear(in, out) with its input features split: rank r holds columns W_r (out, in/t)
    and multiplies its slice x_r (..., in/t) of the input. The partial outputs are summed by g
    (or reduce-scattered to sequence shards), and then the bias is added, once."""

    def __init__(self, linear, group, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = sharded_parameter(linear.weight, 1, group)  # (out, in/t)
        self.bias = replicated_parameter(linear.bias)  # (out,), the same on every rank

    def forward(self, x):
        partial = F.linear(x, self.weight)  # (..., out): this rank's term of the sum
        if not self.sequence_parallel:
            y = g(partial, self.group)
            return y if self.bias is None else y + self.bias
        y = reduce_scatter_sequence(partial, self.group)  # (B, T/t, out)
        # each rank adds the bias to its own tokens only: f sums the bias gradient's pieces
        return y if self.bias is None else y + f(self.bias, self.group)


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding(V, h) with its rows split by token id: rank r holds ids [r V/t, (r+1) V/t).
    Each rank looks up the ids it holds, writes zeros for the rest, and the sum over ranks (g,
    or a reduce-scatter to sequence shards) is the whole lookup."""

    def __init__(self, embedding, group, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = sharded_parameter(embedding.weight, 0, group)  # (V/t, h)
        self.vocab_start = dist.get_rank(group) * self.weight.size(0)

    def forward(self, idx):  # (B, T) token ids -> (B, T, h), or (B, T/t, h) sequence-parallel
        local, outside = local_ids(idx, self.vocab_start, self.weight.size(0))
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(partial, self.group)
        return g(partial, self.group)


def local_ids(ids, start, n):
    """(ids - start with 0 where outside [start, start + n), the mask of those outside)."""
    outside = (ids < start) | (ids >= start + n)
    return (ids - start).masked_fill(outside, 0), outside


class SequenceParallelLayerNorm(nn.Module):
    """nn.LayerNorm on a sequence shard (B, T/t, h). Its weight and bias are whole on every rank
    but see only 1/t of the tokens, so their gradients are partial sums: f all-reduces them in
    backward. (Forgetting this, the ranks' LayerNorms silently drift apart.)"""

    def __init__(self, norm, group):
        super().__init__()
        self.group, self.normalized_shape, self.eps = group, norm.normalized_shape, norm.eps
        self.weight = replicated_parameter(norm.weight)
        self.bias = replicated_parameter(norm.bias)

    def forward(self, x):
        bias = None if self.bias is None else f(self.bias, self.group)
        return F.layer_norm(x, self.normalized_shape, f(self.weight, self.group), bias, self.eps)


class SequenceParallelPositions(nn.Module):
    """The position embeddings of this rank's contiguous 1/t of the sequence; their gradient rows
    come from this rank's tokens only, so f sums them over the group in backward."""

    def __init__(self, embedding, group):
        super().__init__()
        self.group = group
        self.weight = replicated_parameter(embedding.weight)  # (T, h)

    def forward(self, seq_len, device=None):
        t, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        n = seq_len // t
        positions = torch.arange(rank * n, (rank + 1) * n, device=device)  # this shard's T/t ids
        return F.embedding(positions, f(self.weight, self.group))  # (T/t, h)
