"""What one transformer layer saves for backward, tensor by tensor, for any `ModelSpec`
(lesson 07's planner; lesson 01 measures the same tensors with `SavedTensorLog`).

Korthikanti et al. 2022, Table 2 counts GPT-3's layer: LayerNorm, dropout, a 4h GELU MLP and
as many key/value heads as query heads. Llama's layer differs in four places, each a row below:
RMSNorm (one statistic per token, not two), no dropout (no masks), a SwiGLU MLP of width ffn
(three matrices; SiLU and the product save more than GELU does), grouped-query attention (K and
V kv_heads x head_dim wide). Rotary embeddings multiply by cos/sin tables that depend on the
position only: autograd saves those tables, not the activations, so they add no row.

    layer_saved_tensors(spec, 4096, 1, tp=8, sequence_parallel=True)  # [(tensor, bytes, paper)]

The MLP kernel matters for SwiGLU only. Plain autograd ("eager", as torchtitan's FeedForward
runs it) keeps four ffn-wide tensors: the gate x W_gate (SiLU's input), SiLU's output
and the up factor (the product's inputs), and the product (the down projection's input). A
fused kernel ("fused", Megatron-LM's megatron/core/fusions/fused_bias_swiglu.py: its
SwiGLUFunction saves only its input, the gate and up halves side by side, and recomputes SiLU
in backward) leaves three: that 2 ffn-wide input and the down projection's input. GELU's MLP
keeps two either way (Megatron's fused bias_gelu saves its input; the second Linear the GELU
output), so the setting changes nothing for GPT.

`paper` is False for the two kinds of rows Table 2 leaves out as small: the norms' fp32
statistics and the fused kernel's logsumexp. Without them, a GPT-3 layer's rows sum to
`dlcourse.memory.activation_bytes` exactly (tests/test_planner_activations.py; it also holds
every row against what autograd saves in a tiny GPT block and a tiny Llama block).

Conventions, as on a GPU with Megatron-style kernels: e bytes a value (2: bf16), m bytes a
dropout-mask element (1); the norm saves its input and its statistics (fused kernels: Apex,
Transformer Engine); each Linear saves its input; with sequence parallelism every tensor of
width h (norm inputs, the inputs of QKV and of the MLP, masks after the residual branches) is
split along the sequence over the t ranks (Korthikanti §4.2.2), the rest over heads or ffn.
"""

RECOMPUTE = ("none", "selective", "op", "full")  # "op": torchtitan's by-op policy (below)
MLP = ("eager", "fused")  # SwiGLU as autograd keeps it (4 ffn-wide tensors), or one kernel (3)


def layer_saved_tensors(spec, seq_len, micro_batch, *, tp=1, sequence_parallel=False,
                        recompute="none", attention="fused", mlp="eager", bytes_per_value=2,
                        mask_bytes=1, stat_bytes=4):
    """[(tensor, bytes, paper)] one layer of `spec` saves for one micro-batch of `micro_batch`
    sequences of `seq_len` tokens on one tensor-parallel rank. recompute: "none", "selective"
    (the attention scores recomputed), "full" (only the layer's input kept); attention: "fused"
    (FlashAttention / SDPA: no s x s scores) or "eager" (softmax(QK^T) stored); mlp: "eager"
    (autograd's four ffn-wide SwiGLU tensors) or "fused" (three, above). Bytes: a value,
    a dropout-mask element, a norm statistic (CUDA: 2, 1 (bool), 4 (fp32); torch's CPU
    kernels keep masks and LayerNorm statistics in the values' dtype)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if attention not in ("fused", "eager"):
        raise ValueError(f"attention must be 'fused' or 'eager', got {attention!r}")
    if mlp not in MLP:
        raise ValueError(f"mlp must be one of {MLP}, got {mlp!r}")
    tokens, t, e, m = seq_len * micro_batch, tp, bytes_per_value, mask_bytes
    seq = t if sequence_parallel else 1  # the divisor of the h-wide tensors
    h = spec.hidden
    if recompute == "full":
        return [("layer input (the rest recomputed)", tokens * h * e / seq, True)]
    if recompute == "op":
        return _op_rows(spec, seq_len, tokens, t, seq, e, attention)
    rows = _attention_rows(spec, seq_len, tokens, t, seq, e, m, attention, recompute)
    rows += _mlp_rows(spec, tokens, t, seq, e, m, mlp)
    return [(name, nbytes * stat_bytes / 4 if "statistics" in name else nbytes, paper)
            for name, nbytes, paper in rows]


def _norm_rows(spec, name, tokens, seq, e):
    """A norm saves its input and its per-token statistics: LayerNorm (with bias, GPT) its mean
    and 1/std, RMSNorm (Llama) its 1/rms, in fp32 (4 bytes; `stat_bytes` rescales)."""
    stats = 2 if spec.bias else 1
    return [(f"{name} input", tokens * spec.hidden * e / seq, True),
            (f"{name} statistics (fp32)", tokens * stats * 4 / seq, False)]


def _attention_rows(spec, seq_len, tokens, t, seq, e, m, attention, recompute):
    h, a = spec.hidden, spec.n_heads
    kv = spec.kv_heads * (h // a)  # width of K and of V
    rows = _norm_rows(spec, "norm 1", tokens, seq, e)
    rows.append(("QKV input", tokens * h * e / seq, True))
    if attention == "eager":
        # Q K^T and probs V take K and V at the queries' width: grouped-query heads are
        # repeated first (Llama's repeat_kv), and that copy is what the matmuls save.
        rows.append(("Q, K, V (K and V repeated to every query head)",
                     tokens * 3 * h * e / t, True))
        if recompute == "none":
            scores = tokens * a * seq_len / t  # (b, a/t, s, s) values
            rows.append(("softmax output", scores * e, True))
            if spec.dropout:  # probs V then saves dropout's output, not softmax's
                rows += [("attention dropout mask", scores * m, True),
                         ("attention dropout output", scores * e, True)]
    else:  # the kernel saves Q, K, V at their own widths, its output and a logsumexp
        rows.append(("Q, K, V", tokens * (h + 2 * kv) * e / t, True))
        rows.append(("logsumexp (fp32, one a head and query)", tokens * a * 4 / t, False))
    # the fused kernel's output, in (b, s, a, d) order, is the projection's input: one storage
    rows.append(("output projection input", tokens * h * e / t, True))
    if spec.dropout:
        rows.append(("dropout mask after attention", tokens * h * m / seq, True))
    return rows


def _mlp_rows(spec, tokens, t, seq, e, m, mlp):
    f = spec.ffn
    rows = _norm_rows(spec, "norm 2", tokens, seq, e)
    rows.append(("MLP input", tokens * spec.hidden * e / seq, True))
    if spec.gated_mlp and mlp == "fused":  # one kernel: silu(gate) * up, SiLU redone in backward
        rows += [("gate and up, side by side (the fused SwiGLU's input)", 2 * tokens * f * e / t,
                  True),
                 ("SwiGLU output (down projection's input)", tokens * f * e / t, True)]
    elif spec.gated_mlp:  # SwiGLU in autograd: down(silu(x W_gate) * (x W_up))
        rows += [("gate x W_gate (SiLU's input)", tokens * f * e / t, True),
                 ("SiLU output (a factor of the product)", tokens * f * e / t, True),
                 ("up x W_up (the other factor)", tokens * f * e / t, True),
                 ("product (down projection's input)", tokens * f * e / t, True)]
    else:  # down(gelu(x W_fc))
        rows += [("x W_fc (GELU's input)", tokens * f * e / t, True),
                 ("GELU output (down projection's input)", tokens * f * e / t, True)]
    if spec.dropout:
        rows.append(("dropout mask after the MLP", tokens * spec.hidden * m / seq, True))
    return rows


def layer_activation_bytes(spec, seq_len, micro_batch, **settings):
    """The sum of `layer_saved_tensors`: bytes one layer saves on one tp rank."""
    return sum(nbytes for _, nbytes, _ in layer_saved_tensors(spec, seq_len, micro_batch,
                                                              **settings))


def layer_linears(spec):
    """[(name, in width, out width, column-parallel?)] of one layer's weight matmuls in the order
    the forward runs them: torchtitan's Llama (SwiGLU models here) runs wq, wk, wv apart and w1
    before w3 (FeedForward: w2(silu(w1(x)) * w3(x))); GPT runs one fused QKV."""
    h, f = spec.hidden, spec.ffn
    kv = spec.kv_heads * (h // spec.n_heads)
    if spec.gated_mlp:
        return [("wq", h, h, True), ("wk", h, kv, True), ("wv", h, kv, True),
                ("wo", h, h, False), ("w1", h, f, True), ("w3", h, f, True), ("w2", f, h, False)]
    return [("QKV", h, h + 2 * kv, True), ("proj", h, h, False), ("fc", h, f, True),
            ("fc proj", f, h, False)]


def op_recomputed_linears(spec):
    """The layer's matmuls torchtitan's by-op policy recomputes: the 2nd, 4th, ... it runs."""
    return [row for i, row in enumerate(layer_linears(spec)) if i % 2 == 1]


def _op_rows(spec, seq_len, tokens, t, seq, e, attention):
    """torchtitan's selective checkpointing by op (`op_checkpoint.py`): the layer's input, the
    outputs of the 1st, 3rd, ... matmul (a row-parallel one's partial sum is h wide on every
    rank) and of attention's kernels (fused: SDPA's output and logsumexp; eager: the two bmms,
    Q K^T and probs V); norms, activations, softmax and the other matmuls are recomputed."""
    h, a = spec.hidden, spec.n_heads
    rows = [("layer input (the checkpoint's)", tokens * h * e / seq, True)]
    for i, (name, _, out, column) in enumerate(layer_linears(spec)):
        if i % 2 == 0:
            rows.append((f"{name} output (saved matmul)", tokens * out * e / (t if column else 1),
                         True))
    if attention == "eager":
        rows += [("Q K^T (saved bmm)", tokens * a * seq_len * e / t, True),
                 ("probs V (saved bmm)", tokens * h * e / t, True)]
    else:
        rows += [("attention output (saved SDPA)", tokens * h * e / t, True),
                 ("logsumexp (fp32, saved with it)", tokens * a * 4 / t, False)]
    return rows
