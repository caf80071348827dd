"""The references of lesson 08's checks, written here apart from the lesson's library: plain
single-process softmax attention in float64, the zig-zag layout from its definition, and the
cases the checks draw. While a student's code runs these are refused too (`answers.py`): a
check's reference is an answer key.
"""

import math

import torch


def attention(q, k, v, q_pos, k_pos, causal=True):
    """softmax(q kᵀ/√d, masked) v over the keys given, in float64, and each query's log-sum-exp:
    (out (b, a, n, d), lse (b, a, n)). A query that sees none of the keys gets out 0, lse -inf.
    q (b, a, n, d), k and v (b, a, m, d); q_pos (n,) and k_pos (m,) global positions; causal: a
    query at position i sees the keys at positions j <= i, its own included."""
    seen = q_pos[:, None] >= k_pos[None, :] if causal else None
    return attention_where(q, k, v, seen)


def attention_where(q, k, v, seen=None):
    """`attention` with the keys each query sees given as an (n, m) bool matrix (None: all)."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (b, a, n, m)
    if seen is not None:
        scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (b, a, n); -inf where no key is seen
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)  # rows with no key: 0
    return probs @ v, lse


def zigzag(rank, cp, seq_len):
    """The global positions of the tokens rank `rank` holds in the zig-zag layout, in local
    order: the sequence cut into 2·cp chunks, rank r holding chunk r, then chunk 2·cp - 1 - r."""
    c = seq_len // (2 * cp)
    return [r * c + i for r in (rank, 2 * cp - 1 - rank) for i in range(c)]


def contiguous(rank, cp, seq_len):
    """The positions rank `rank` holds when the sequence is cut into cp chunks in order."""
    n = seq_len // cp
    return list(range(rank * n, (rank + 1) * n))


def causal_pairs(positions):
    """The query-key pairs a rank holding queries at `positions` computes under a causal mask
    over the whole sequence: each query at i sees the i + 1 keys at 0..i."""
    return sum(p + 1 for p in positions)


def world_sizes(rng, n, low=2, high=5):
    """n numbers of ranks from low to high in random order, at least two of them not 4 (an
    answer right for the lesson's 4 ranks only fails)."""
    odd = [p for p in range(low, high + 1) if p != 4]
    sizes = rng.sample(odd, 2) + [rng.randint(low, high) for _ in range(n - 2)]
    rng.shuffle(sizes)
    return sizes


def normal(shape, rng, dtype=torch.float64, scale=1.0):
    """A tensor of normal values from a seed the rng draws (one of 2**62: not to be guessed)."""
    generator = torch.Generator().manual_seed(rng.randrange(2**62))
    return (scale * torch.randn(shape, generator=generator, dtype=torch.float64)).to(dtype)
