"""Attention one block at a time, and the online softmax that merges the blocks (lesson 08,
`lessons/08_context_parallel.ipynb`). Every context-parallel method here is built on these.

Softmax attention over keys split into blocks K = [K_1, K_2] can be computed block by block.
For one query row with scores x (split x_1, x_2), the log-sum-exp lse = log Σ_j exp(x_j) is the
softmax's normaliser, and

    lse   = log(exp(lse_1) + exp(lse_2))            (`torch.logaddexp`: subtracts the max first)
    out   = exp(lse_1 - lse) · out_1 + exp(lse_2 - lse) · out_2

where out_i = softmax(x_i) @ V_i is block i's attention alone. This is FlashAttention's online
softmax (Dao et al. 2022, Algorithm 1; Milakov & Gimelshein 2018) written with lse = m + log l
(running max m, running sum l) as FlashAttention-2 stores it (Dao 2023, Section 3.1.1). Nothing
else about the other blocks is needed, so no rank ever holds a whole s x s score matrix.

The backward needs only each row's final lse and D = rowsum(dO ∘ O) (FlashAttention, Appendix
B.2): P = exp(S - lse) recomputes the probabilities of any one block, and then

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - D),   dQ = dS K / √d,   dK = dSᵀ Q / √d

Shapes: q (b, a, n, d) with its global positions q_pos (n,), k and v (b, a, m, d) with k_pos (m,);
a causal mask lets query position i see key position j when i >= j, whatever rank holds them.
"""

import math

import torch


def visible(q_pos, k_pos, causal):
    """Which scores of a block a causal mask keeps: "all", "none", or a (n, m) bool mask."""
    if not causal or q_pos.min() >= k_pos.max():
        return "all"
    if q_pos.max() < k_pos.min():
        return "none"  # every key is after every query: the block is skipped, not computed
    return q_pos[:, None] >= k_pos[None, :]  # (n, m), True = may attend


def _scores(q, k, mask):
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (b, a, n, m)
    if not isinstance(mask, str):
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def attention_block(q, k, v, q_pos, k_pos, causal):
    """One query block against one key/value block: (out (b, a, n, d), lse (b, a, n)).

    out is the softmax attention over this block's keys alone; lse its log-sum-exp per query.
    Callers skip a block `visible` calls "none" (its rows would have no key: lse = -inf).
    """
    scores = _scores(q, k, visible(q_pos, k_pos, causal))  # (b, a, n, m)
    lse = torch.logsumexp(scores, dim=-1)  # (b, a, n)
    out = torch.exp(scores - lse.unsqueeze(-1)) @ v  # (b, a, n, d)
    return out, lse


def merge(out_1, lse_1, out_2, lse_2):
    """Two partial results for the same queries over two disjoint key sets -> the result over
    both: (out (b, a, n, d), lse (b, a, n)). The online softmax's step."""
    lse = torch.logaddexp(lse_1, lse_2)  # (b, a, n)
    w_1, w_2 = torch.exp(lse_1 - lse).unsqueeze(-1), torch.exp(lse_2 - lse).unsqueeze(-1)
    out = w_1 * out_1 + w_2 * out_2  # each block's softmax rescaled to the common normaliser
    return out, lse


def attention_block_backward(dout, delta, lse, q, k, v, q_pos, k_pos, causal):
    """Gradients of one block's share, given the queries' final lse and delta = rowsum(dO ∘ O)
    (both (b, a, n)): (dq (b, a, n, d), dk (b, a, m, d), dv (b, a, m, d)).
    Summed over every block, dq is the whole dQ; dk and dv are these queries' part of dK, dV."""
    scores = _scores(q, k, visible(q_pos, k_pos, causal))
    probs = torch.exp(scores - lse.unsqueeze(-1))  # (b, a, n, m): the softmax, recomputed
    dv = probs.transpose(-2, -1) @ dout  # (b, a, m, d)
    dprobs = dout @ v.transpose(-2, -1)  # (b, a, n, m)
    dscores = probs * (dprobs - delta.unsqueeze(-1)) / math.sqrt(q.size(-1))
    return dscores @ k, dscores.transpose(-2, -1) @ q, dv


class BlockAttention(torch.autograd.Function):
    """Attention of q against one k/v block on one rank, FlashAttention-style: the forward saves
    q, k, v, the output and its lse, never the (n, m) probabilities; the backward recomputes them.
    Ulysses and all-gather-KV run it after their communication."""

    @staticmethod
    def forward(ctx, q, k, v, q_pos, k_pos, causal):
        out, lse = attention_block(q, k, v, q_pos, k_pos, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.q_pos, ctx.k_pos, ctx.causal = q_pos, k_pos, causal  # not tensors autograd tracks
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        delta = (dout * out).sum(-1)  # (b, a, n)
        dq, dk, dv = attention_block_backward(dout, delta, lse, q, k, v, ctx.q_pos, ctx.k_pos,
                                              ctx.causal)
        return dq, dk, dv, None, None, None


def block_attention(q, k, v, q_pos, k_pos, causal=True):
    """softmax(q kᵀ/√d + mask) v with the mask from global positions; (b, a, n, d)."""
    return BlockAttention.apply(q, k, v, q_pos, k_pos, causal)
