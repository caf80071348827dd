"""Per-layer communication against compute for Megatron tensor parallelism (lesson 04,
`lessons/04_tensor_parallel.ipynb`, Step 8). Pure arithmetic: no ranks, no timing.

Compute. One transformer layer's forward on b sequences of s tokens, hidden h, runs the matmuls
    qkv 2·bs·h·3h + scores 2·bs·s·h + probs·V 2·bs·s·h + proj 2·bs·h·h + fc 2·bs·h·4h + proj 2·bs·4h·h
    = 24·bsh² + 4·bs²h FLOPs,
and its backward twice that (a gradient for the input and one for the weight per matmul): in all
    72·bsh² (1 + s/(6h)) FLOPs per layer and step,
which is Narayanan et al. 2021 (eq. 3, Appendix) with its 96 -> 72: their 96 counts a fourth pass,
the forward recomputed under activation checkpointing; their V/(16 l h) term is the output layer,
not a transformer layer. Tensor parallelism splits every one of these matmuls: 1/t per rank.

Communication. Per layer and step, 4 all-reduces (Shoeybi et al. 2019: two g forward, two f
backward) of the (b, s, h) activation; on a ring each rank sends 2(t-1)/t of it:
    4 · 2(t-1)/t · bsh · bytes_per_value bytes per rank.

Ratio (time on the link / time computing), with link bandwidth B and compute rate F:
    [8(t-1)/t · bsh · e / B] / [72 bsh²/t / F] = (t-1) · e · F / (9 · h · B)    (s/(6h) dropped)
b and s cancel: the ratio grows with t and falls with h, as t/h.
"""


def layer_flops(batch, seq_len, hidden, tp=1, attention=True):
    """FLOPs of one transformer layer's forward and backward on one of `tp` ranks:
    72·bsh²/t, times (1 + s/(6h)) with the attention scores' two matmuls counted."""
    flops = 72 * batch * seq_len * hidden ** 2
    if attention:
        flops += 12 * batch * seq_len ** 2 * hidden
    return flops / tp


def layer_comm_bytes(batch, seq_len, hidden, tp, bytes_per_value=2):
    """Bytes one rank sends per layer and step on a ring: 4 all-reduces of b·s·h values, each
    2(t-1)/t of them (0 at t = 1)."""
    return 4 * 2 * (tp - 1) / tp * batch * seq_len * hidden * bytes_per_value


def comm_compute_ratio(hidden, tp, link_bytes_per_s, flops_per_s, bytes_per_value=2):
    """(t-1)·e·F / (9·h·B): seconds on the link per second of matmuls, for one layer at `tp`,
    ignoring latency and the attention-score matmuls; b and s cancel."""
    return (tp - 1) * bytes_per_value * flops_per_s / (9 * hidden * link_bytes_per_s)
