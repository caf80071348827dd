"""Lesson 08, exercise 3 (`ring_attention_step.py`): the commonest wrong ring steps, recognised by
what they return or raise, each with the hint that names it. A wrong answer is rebuilt here from the
keys a rank has seen (`keys_seen`) and compared with what came back: the diagonal masked, a mask
from local indices, no mask, the blocks alone instead of merged, an overflowing softmax. Group ranks
passed where torch 2.13 reads global ones raise inside torch (`in_rank.peers_explained` says which
numbering torch reads).
"""

import torch

from dlcourse.checks.context.reference import attention, attention_where

RING_HINT = ("send kv to the group's rank (rank + 1) % cp, receive the next block from its rank "
             "(rank - 1) % cp into a new buffer (group ranks: group_peer= in dist.P2POp, or "
             "dist.get_global_rank(group, i) for peer=); attend q to kv with the mask q_pos >= "
             "kv_pos; merge with the log-sum-exps as in exercise 1")


def keys_seen(kvs, positions, owners, prefix):
    """The keys a rank has seen after holding the blocks of `owners` (the prefix's first):
    k, v (b, a, m, d), their global positions and their local indices (m,) (the prefix's -1)."""
    blocks = ([prefix] if prefix is not None else []) + [kvs[o] for o in owners]
    k, v = (torch.cat([block[i] for block in blocks], dim=2) for i in (0, 1))
    before = [torch.full((prefix.size(3),), -1)] if prefix is not None else []
    k_pos = torch.cat(before + [positions[o] for o in owners])
    local = torch.cat(before + [torch.arange(positions.size(1)) for _ in owners])
    return k, v, k_pos, local


def explain(name, got, q, kvs, held, owners, positions, prefix, r, j):
    """The hint for the commonest mistakes, recognised by what came back."""
    k, v, k_pos, local = keys_seen(kvs, positions, owners, prefix)
    q_pos, n = positions[r], q.size(2)
    pick = 0 if name == "out" else 1
    variants = [
        (q_pos[:, None] > k_pos[None, :], "each query's own key is masked: a query at position "
         "i sees the keys at positions j <= i, itself included (the diagonal)"),
        (torch.arange(n)[:, None] >= local[None, :], "the mask was built from local indices "
         "0..n-1: build it from the global positions q_pos and kv_pos, which say where each "
         "token sits in the whole sequence"),
        (None, "no causal mask: a query sees the keys at or before its own position only"),
    ]
    for seen, says in variants:
        if torch.allclose(got, attention_where(q, k, v, seen)[pick], rtol=1e-8, atol=1e-10):
            return says
    if prefix is not None:
        k, v, k_pos, _ = keys_seen(kvs, positions, owners, None)
        if torch.allclose(got, attention(q, k, v, q_pos, k_pos)[pick], rtol=1e-8, atol=1e-10):
            return ("that is attention over the blocks alone: merge the block into the (out, "
                    "lse) the step is given, which may hold keys it never saw (here a prefix)")
    alone = attention(q, kvs[held][0], kvs[held][1], q_pos, positions[held])
    if j > 0 and torch.allclose(got, alone[pick], rtol=1e-8, atol=1e-10):
        return ("that is this block's attention alone: merge it into the running (out, lse) "
                "with the log-sum-exps, as in exercise 1")
    if float(q.abs().max()) > 100:  # the last case, drawn after two with scores ~1 passed
        # inf or NaN, or (after a nan_to_num) finite but wrong: which depends on the draw
        return ("wrong where the scores are large (in the thousands), right where they are ~1: "
                "exp of a score or of an lse that large overflows float64 (e^709); subtract the "
                "row's max before exp (torch.logsumexp and torch.logaddexp do)")
    if got.isnan().any():
        return ("NaN: a query that sees no key of this block has lse -inf there and a softmax "
                "of all -inf is NaN; skip such rows (or a block no query can see), or zero them "
                "before merging")
    return RING_HINT
