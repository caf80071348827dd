"""Tensor-parallel layers (lesson 04, `lessons/04_tensor_parallel.ipynb`): each is built from the
plain layer it replaces and keeps only this rank's share of its weights. The communication is
`comm.py`'s f, g and the sequence-parallel pair; no layer calls a collective itself.

    ColumnParallelLinear    W split by output rows: y_r = x W_r^T, (..., out/t) on rank r
    RowParallelLinear       W split by input columns: y = sum_r x_r W_r^T, all-reduced (g)
    VocabParallelEmbedding  rows of the (V, h) table split by token id, partial lookups summed
    SequenceParallelLayerNorm  LayerNorm on a sequence shard, its weights' gradients summed (f)
    SequenceParallelPositions  the position embeddings of this rank's sequence shard

Every sharded parameter carries `tp_dim` and `tp_parts` (how `shard` cut it), so
`unshard` can put the whole tensor back together for the proofs. Under sequence parallelism the
whole parameters that see only T/t tokens (LayerNorms, row-parallel biases, positions) carry
`sequence_partial`: their gradients are partial sums, summed by `f` in backward, or, with
sum_grads=False, left partial for one coalesced all-reduce after backward
(`grads.all_reduce_sequence_partial_grads`).
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


def sequence_partial_parameter(full):
    """A whole parameter that sees only this rank's sequence shard: its gradient is partial."""
    p = replicated_parameter(full)
    if p is not None:
        p.sequence_partial = True  # read by grads.all_reduce_sequence_partial_grads
    return p


def summed(p, group, sum_grads):
    """p through f (its gradient summed over the group in backward), or p as it is."""
    return f(p, group) if sum_grads and p is not None else p


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

    def __init__(self, linear, group, sequence_parallel=False, sum_grads=True):
        super().__init__()
        self.group, self.sequence_parallel, self.sum_grads = group, sequence_parallel, sum_grads
        self.weight = sharded_parameter(linear.weight, 1, group)  # (out, in/t)
        whole = sequence_partial_parameter if sequence_parallel else replicated_parameter
        self.bias = whole(linear.bias)  # (out,), the same on every rank

    def forward(self, x):
        partial = F.linear(x, self.weight)  # (..., out): this rank's term of the sum
        if not self.sequence_parallel:
            y = g(partial, self.group)
            return y if self.bias is None else y + self.bias
        y = reduce_scatter_sequence(partial, self.group)  # (B, T/t, out)
        # each rank adds the bias to its own tokens only: f sums the bias gradient's pieces
        return y if self.bias is None else y + summed(self.bias, self.group, self.sum_grads)


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
    backward, or once for all of them after backward with sum_grads=False. (Forgetting this, the
    ranks' LayerNorms silently drift apart: Megatron-LM issue #1446.)"""

    def __init__(self, norm, group, sum_grads=True):
        super().__init__()
        self.group, self.normalized_shape, self.eps = group, norm.normalized_shape, norm.eps
        self.sum_grads = sum_grads
        self.weight = sequence_partial_parameter(norm.weight)
        self.bias = sequence_partial_parameter(norm.bias)

    def forward(self, x):
        weight, bias = (summed(p, self.group, self.sum_grads) for p in (self.weight, self.bias))
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class SequenceParallelPositions(nn.Module):
    """The position embeddings of this rank's contiguous 1/t of the sequence; their gradient rows
    come from this rank's tokens only, so f sums them over the group in backward."""

    def __init__(self, embedding, group, sum_grads=True):
        super().__init__()
        self.group, self.sum_grads = group, sum_grads
        self.weight = sequence_partial_parameter(embedding.weight)  # (T, h)

    def forward(self, seq_len, device=None):
        t, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        n = seq_len // t
        positions = torch.arange(rank * n, (rank + 1) * n, device=device)  # this shard's T/t ids
        return F.embedding(positions, summed(self.weight, self.group, self.sum_grads))  # (T/t, h)
