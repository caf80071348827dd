"""What context parallelism costs, measured beside the formulas (lesson 08,
`lessons/08_context_parallel.ipynb`).

    count_layer(config, batch, group, method)   # one Block's messages, counted (CommCounter)
    layer_formula(config, batch, cp, method)    # the same from the algorithms
    layer_bytes_sent(config, batch, cp, method) # what one rank's link carries out, per layer
    cp_saved_tensors(config, batch, cp, method) # every tensor one rank saves for backward
    cp_layer_bytes(config, batch, cp, method)   # one layer of that, in closed form
    ring_step(batch, block_len, hidden)         # one ring step: flops against message bytes
    block_to_hide(batch, hidden, F, alpha, beta)  # the shortest block the ring hides behind

Communication of one layer's attention, per rank, in values (b batch, s tokens, h hidden):
    ring, zigzag  forward: cp-1 sends (and receives) of K and V, 2·b·(s/cp)·h values each;
                  backward: as many again for K and V, and cp-1 of dK and dV to bring them home.
                  Each way, (cp-1)/cp of K and V per pass.
    ulysses       forward: 4 all-to-alls (q, k, v in; the output back) of b·s·h/cp values per
                  rank; backward: 4 more, the reverse ones.
    allgather     forward: 1 all-gather of K and V, 2·b·s·h values gathered; backward: 1
                  reduce-scatter of their gradients, the same size.
The weights are replicated, so a training step also averages the gradients (Ψ values) once.
"""

import math
from collections import Counter

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory.estimate import SavedTensorEstimate
from dlcourse.models import Block
from dlcourse.parallel.context.parallelize import METHODS, cp_block, cp_layout


def count_layer(config, batch, group, method="ring", seed=0):
    """Run one context-parallel `Block` forward and backward on random local input (b, s/cp, h)
    and count the messages: {"forward": [CommRecord], "backward": [CommRecord]} on this rank."""
    block = cp_block(Block(config), group, cp_layout(config, group, method), method)
    cp = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, config.seq_len // cp, config.hidden, generator=gen).requires_grad_()
    with CommCounter() as forward:
        y = block(x)
    with CommCounter() as backward:
        y.sum().backward()
    return {"forward": forward.records, "backward": backward.records}


def layer_formula(config, batch, cp, method="ring"):
    """{"forward"/"backward": Counter({(op, values): calls})} of one layer on one rank."""
    if method not in METHODS:
        raise ValueError(f"unknown context-parallel method {method!r}; one of {sorted(METHODS)}")
    bsh = batch * config.seq_len * config.hidden
    if cp == 1:
        return {"forward": Counter(), "backward": Counter()}
    if method in ("ring", "zigzag"):
        kv = 2 * bsh // cp  # one message: this rank's K and V (or dK and dV)
        one_pass = Counter({("send", kv): cp - 1, ("recv", kv): cp - 1})
        return {"forward": one_pass, "backward": one_pass + one_pass}
    if method == "ulysses":
        return {"forward": Counter({("all_to_all", bsh // cp): 4}),
                "backward": Counter({("all_to_all", bsh // cp): 4})}
    return {"forward": Counter({("all_gather", 2 * bsh): 1}),
            "backward": Counter({("reduce_scatter", 2 * bsh): 1})}


def layer_bytes_sent(config, batch, cp, method="ring", itemsize=4):
    """Bytes one rank sends to the others for one layer, forward and backward (on a ring for the
    collectives, nccl-tests' bus factors): what its link carries out, to set beside `sent_bytes`.

        ring, zigzag  3 passes (K/V forward, K/V and dK/dV backward) x (cp-1) x 2·b·s·h/cp
        ulysses       8 all-to-alls x (cp-1)/cp x b·s·h/cp
        allgather     all-gather + reduce-scatter, 2 x (cp-1)/cp x 2·b·s·h
    Ulysses' volume per rank shrinks as cp grows; the ring's and all-gather's do not.
    """
    bsh = batch * config.seq_len * config.hidden
    values = {"ring": 3 * (cp - 1) * 2 * bsh / cp, "zigzag": 3 * (cp - 1) * 2 * bsh / cp,
              "ulysses": 8 * (cp - 1) / cp * bsh / cp, "allgather": 2 * (cp - 1) / cp * 2 * bsh}
    return values[method] * itemsize


def sent_bytes(records):
    """Bytes a rank sent over its link in `records`: each send's message, each collective's size
    x its bus factor (lesson 02, `CommRecord.bus_bytes`); receives are the other end of a send."""
    return sum(r.bus_bytes() for r in records if r.op != "recv")


def as_counter(records, itemsize=4):
    """CommRecords -> Counter({(op, values): calls}), to set beside `layer_formula`."""
    return Counter((r.op, r.nbytes // itemsize) for r in records)


def cp_saved_tensors(config, batch, cp, method="ring"):
    """Every tensor one rank of `context_parallel(GPT(config), group, method)` saves in a forward
    and `lm_loss`, fp32 on CPU, dropout 0, as `SavedTensorEstimate` rows (its token ids and
    targets are the caller's, not counted). n = s/cp: everything but all-gather's K/V is in n."""
    B, s, h, a, V, L = (batch, config.seq_len, config.hidden, config.n_heads, config.vocab_size,
                        config.n_layers)
    n = s // cp
    Bn = B * n
    if method in ("ring", "zigzag"):
        attention = [("q, k, v (views of the qkv output)", 3 * Bn * h)]
    elif method == "ulysses":
        attention = [("q, k, v of a/cp heads, whole sequence (all-to-all outputs)", 3 * Bn * h)]
    else:
        attention = [("q (a view of the qkv output)", 3 * Bn * h),
                     ("K and V of every rank, all-gathered", 2 * B * s * h)]
    block = [("ln1 input", Bn * h), ("ln1 mean and 1/std", 2 * Bn), ("qkv input", Bn * h),
             *attention, ("attention output", Bn * h), ("log-sum-exp per query and head", Bn * a),
             ("proj input", Bn * h), ("ln2 input", Bn * h), ("ln2 mean and 1/std", 2 * Bn),
             ("fc input", Bn * h), ("GELU input", 4 * Bn * h), ("mlp proj input", 4 * Bn * h)]
    rows = [SavedTensorEstimate("embedding", "global position ids (int64)", n, 8)]
    rows += [SavedTensorEstimate("block", what, numel, 4, L) for what, numel in block]
    rows += [SavedTensorEstimate("head", "ln_f input", Bn * h, 4),
             SavedTensorEstimate("head", "ln_f mean and 1/std", 2 * Bn, 4),
             SavedTensorEstimate("head", "lm_head input", Bn * h, 4),
             SavedTensorEstimate("loss", "log-probabilities (fp32)", Bn * V, 4),
             SavedTensorEstimate("loss", "sum of target weights (fp32)", 1, 4)]
    return rows


def cp_layer_bytes(config, batch, cp, method="ring", bytes_per_value=4):
    """One layer's saved activations on one rank, in closed form: e·b·(s/cp)·(17h + a + 4), and
    for all-gather-KV the gathered K and V on top, e·2·b·s·h (which do not shrink with cp).
    17h: LayerNorm, qkv, proj, fc inputs (4h), q, k, v (3h), the output (h), GELU in and out (8h),
    the second LayerNorm input (h); a: one lse per head; 4: two LayerNorms' mean and 1/std."""
    b, s, h, a = batch, config.seq_len, config.hidden, config.n_heads
    per_layer = b * (s // cp) * (17 * h + a + 4)
    if method == "allgather":
        per_layer += 2 * b * s * h
    return bytes_per_value * per_layer


def ring_step(batch, block_len, hidden, bytes_per_value=4):
    """One ring step without a mask: {"flops": of one block pair, "bytes": of the K/V message}.
    Two matmuls (q kᵀ and p v) of 2·b·c²·h flops each over all heads (h = a·d); the message is
    K and V of c tokens, 2·b·c·h values."""
    return {"flops": 4 * batch * block_len ** 2 * hidden,
            "bytes": 2 * batch * block_len * hidden * bytes_per_value}


def block_to_hide(batch, hidden, flops_per_s, alpha, beta, bytes_per_value=4):
    """The shortest block c (tokens per rank) whose compute takes at least as long as its K/V
    message, so that the ring can hide it, in lesson 02's alpha-beta model (`ring_step`):

        4·b·c²·h / F  >=  alpha + 2·b·c·h·e·beta

    F: flops per second; alpha: seconds per message; beta: seconds per byte (1 / bandwidth B).
    Compute grows as c², the message as c. With alpha = 0 the bound is c >= F·e·beta / 2, which
    for 16-bit values (e = 2) is c >= F / B: the chip's flops per second over the link's bytes
    per second, in tokens, whatever b and h (the ring attention paper's form of the bound)."""
    quad = 4 * batch * hidden / flops_per_s  # seconds of compute per c²
    lin = -2 * batch * hidden * bytes_per_value * beta  # minus seconds of message per c
    const = -alpha
    root = (-lin + math.sqrt(lin * lin - 4 * quad * const)) / (2 * quad)  # the positive root
    c = max(1, math.ceil(root))
    if c > 1 and quad * (c - 1) ** 2 + lin * (c - 1) + const >= 0:  # root a rounding above whole
        c -= 1
    return c
