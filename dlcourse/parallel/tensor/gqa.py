"""Grouped-query attention (GQA; MQA when there is one KV head) under tensor parallelism, with
fewer KV heads than ranks (lesson 04, `lessons/04_tensor_parallel.ipynb`, "What real models need").

In GQA (Ainslie et al. 2023) a heads of queries share n_kv heads of keys and values: query head i
reads KV head i // (a / n_kv). Tensor parallelism still gives rank r the query heads
[r a/t, (r+1) a/t); it then needs the KV heads those queries read:
    n_kv >= t: n_kv/t KV heads of its own, split like the query heads;
    n_kv <  t: one KV head, the same on t/n_kv ranks: the KV head is *replicated*.
A replicated KV weight sees only its rank's queries, so, like a sequence-parallel LayerNorm, its
gradient is a partial sum: `comm.sum_over_holders` adds up the holders' parts in backward.
(vLLM's QKVParallelLinear replicates KV heads this way; Megatron-core asks n_kv % t == 0.)

    GroupedQueryAttention        the plain, single-process reference (no ranks)
    TensorParallelGQA            rank r's query heads and the KV heads they read
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.parallel.tensor.comm import f, g, sum_over_holders


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with n_heads query heads and n_kv_heads shared key/value heads."""

    def __init__(self, hidden, n_heads, n_kv_heads, seed=0):
        super().__init__()
        if hidden % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"GQA: n_heads {n_heads} must divide hidden {hidden} and n_kv_heads "
                             f"{n_kv_heads} must divide n_heads")
        torch.manual_seed(seed)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, hidden // n_heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, n_kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, n_kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):  # (B, T, h) -> (B, T, h)
        return self.proj(attend(self.q(x), self.k(x), self.v(x), self.head_dim))


def attend(q, k, v, head_dim):
    """Causal attention of (B, T, nq·d) queries on (B, T, nkv·d) keys and values; each KV head
    serves nq/nkv consecutive query heads. -> (B, T, nq·d)."""
    B, T, _ = q.shape
    q, k, v = (z.view(B, T, -1, head_dim).transpose(1, 2) for z in (q, k, v))  # (B, heads, T, d)
    repeat = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)  # (B, nq, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    probs = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return (probs @ v).transpose(1, 2).reshape(B, T, -1)


def kv_heads_of_rank(n_heads, n_kv_heads, tp, rank):
    """range of the KV heads that rank `rank`'s query heads [r a/t, (r+1) a/t) read."""
    if n_heads % tp or (n_kv_heads % tp and tp % n_kv_heads):
        raise ValueError(f"GQA with tp {tp}: tp must divide n_heads {n_heads}, and n_kv_heads "
                         f"{n_kv_heads} must divide tp or be divisible by it")
    per_kv = n_heads // n_kv_heads  # query heads per KV head
    first_q, last_q = rank * n_heads // tp, (rank + 1) * n_heads // tp - 1
    return range(first_q // per_kv, last_q // per_kv + 1)


class TensorParallelGQA(nn.Module):
    """`GroupedQueryAttention` on one rank of `group`: q by its query heads (column-parallel),
    k and v by the KV heads those read (replicated when n_kv < t), proj by rows, one g."""

    def __init__(self, attn, group):
        super().__init__()
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        d, self.group, self.head_dim = attn.head_dim, group, attn.head_dim
        self.kv_heads = kv_heads_of_rank(attn.n_heads, attn.n_kv_heads, t, rank)
        self.replicated = attn.n_kv_heads < t  # each KV head on t/n_kv ranks
        q_rows = slice(rank * attn.n_heads // t * d, (rank + 1) * attn.n_heads // t * d)
        kv_rows = slice(self.kv_heads.start * d, self.kv_heads.stop * d)
        self.kv_rows, self.n_kv_rows = kv_rows, attn.n_kv_heads * d
        self.q = nn.Parameter(attn.q.weight.detach()[q_rows].clone())  # (a/t·d, h)
        self.k = nn.Parameter(attn.k.weight.detach()[kv_rows].clone())  # (kv_local·d, h)
        self.v = nn.Parameter(attn.v.weight.detach()[kv_rows].clone())
        self.proj = nn.Parameter(attn.proj.weight.detach()[:, q_rows].clone())  # (h, a/t·d)

    def forward(self, x):  # (B, T, h) whole on every rank -> (B, T, h)
        x = f(x, self.group)
        k, v = self.k, self.v
        if self.replicated:  # the holders' partial gradients summed in backward
            k, v = (sum_over_holders(w, self.kv_rows, self.n_kv_rows, self.group) for w in (k, v))
        y = attend(F.linear(x, self.q), F.linear(x, k), F.linear(x, v), self.head_dim)
        return g(F.linear(y, self.proj), self.group)  # (B, T, h): the partial outputs summed
