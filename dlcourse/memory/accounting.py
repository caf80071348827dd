"""Memory accounting from the papers: parameters, model state, activations (lesson 01).

    count_params(GPTConfig())                      # Ψ, exactly sum(p.numel()) of the model
    count_params(MoEConfig(), active=True)         # lesson 09: the weights one token's forward uses
    model_state_bytes(7.5e9, dp=64, zero_stage=3)  # ZeRO (Rajbhandari et al. 2019), per rank
    activation_bytes(2048, 1, 12288, 96)           # Korthikanti et al. 2022, Table 2, per layer

Everything here is arithmetic on sizes: no model is built, no tensor allocated. The lesson sets
each formula beside a measurement (`dlcourse.memory.measure`).
"""

import math
from dataclasses import dataclass, fields

from dlcourse.models import GPTConfig, MLPConfig, MoEConfig


@dataclass
class MemoryParts:
    """Bytes by what holds them. Formulas fill the first three; a measured step fills all five."""

    params: float = 0  # the model's weights (a tied weight counted once)
    grads: float = 0  # .grad of every parameter
    optimizer: float = 0  # optimizer state: Adam's momentum and variance (+ master weights in ZeRO)
    activations: float = 0  # tensors autograd saved for backward
    weight_copies: float = 0  # low-precision copies of weights that autocast made for backward

    @property
    def model_state(self):
        """Parameters + gradients + optimizer state: what ZeRO partitions."""
        return self.params + self.grads + self.optimizer

    @property
    def total(self):
        return self.model_state + self.activations + self.weight_copies

    def as_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------- parameters (Ψ)


def param_shapes(config):
    """{name: shape} of every parameter of `GPT(config)`, `MoEGPT(config)` (a `MoEConfig`) or
    `MLP(config)`, a tied weight once.

    The names are those of `model.named_parameters()`; the table is written from the
    architecture, not read from a model, so a test can hold one against the other.
    """
    if isinstance(config, MLPConfig):
        return _mlp_shapes(config)
    if not isinstance(config, GPTConfig):
        raise TypeError(f"param_shapes takes a GPTConfig or an MLPConfig, "
                        f"got {type(config).__name__}")
    V, T, h = config.vocab_size, config.seq_len, config.hidden
    shapes = {"tok_emb.weight": (V, h), "pos_emb.weight": (T, h)}
    for i in range(config.n_layers):
        for name, shape in _block_shapes(h, config.bias).items():
            shapes[f"blocks.{i}.{name}"] = shape
        if isinstance(config, MoEConfig) and i in config.moe_blocks:
            _swap_in_moe(shapes, f"blocks.{i}.mlp.", config)
    shapes.update(_layernorm_shapes("ln_f", h, config.bias))
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (V, h)  # tied: it is tok_emb.weight, already listed
    return shapes


def _block_shapes(h, bias):
    """One Block's parameters in module order; a Linear (d_in -> d_out) stores (d_out, d_in)."""
    layout = [("ln1", None), ("attn.qkv", (h, 3 * h)), ("attn.proj", (h, h)),
              ("ln2", None), ("mlp.fc", (h, 4 * h)), ("mlp.proj", (4 * h, h))]
    shapes = {}
    for name, linear in layout:
        if linear is None:  # a LayerNorm
            shapes.update(_layernorm_shapes(name, h, bias))
            continue
        d_in, d_out = linear
        shapes[f"{name}.weight"] = (d_out, d_in)
        if bias:
            shapes[f"{name}.bias"] = (d_out,)
    return shapes


def _swap_in_moe(shapes, prefix, config):
    """Replace the dense MLP's shapes under `prefix` by the MoE's (lesson 09, `dlcourse/moe.py`):
    a router Linear h -> E without bias, then E experts stacked: fc (E, f, h), proj (E, h, f)."""
    for name in [n for n in shapes if n.startswith(prefix)]:
        del shapes[name]
    E, h, f = config.n_experts, config.hidden, config.ffn_hidden
    shapes[prefix + "router.weight"] = (E, h)
    for name, (d_in, d_out) in (("fc", (h, f)), ("proj", (f, h))):
        shapes[f"{prefix}experts.{name}.weight"] = (E, d_out, d_in)
        if config.bias:
            shapes[f"{prefix}experts.{name}.bias"] = (E, d_out)


def _layernorm_shapes(name, h, bias):
    return {f"{name}.weight": (h,), **({f"{name}.bias": (h,)} if bias else {})}


def _mlp_shapes(config):
    widths = [config.d_in] + [config.hidden] * config.n_layers + [config.d_out]
    shapes = {}
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        shapes[f"{2 * i}.weight"], shapes[f"{2 * i}.bias"] = (b, a), (b,)  # Linear, then GELU
    return shapes


def count_params(config, active=False):
    """Ψ (`n_params`): the number of parameters of `GPT(config)` or `MLP(config)`, a tied
    weight counted once. For the GPT, per block: 12h² weights (qkv 3h², proj h², MLP 8h²) and,
    with biases, 13h more (qkv 3h, proj h, fc 4h, proj h, two LayerNorms 4h).

    A `MoEConfig` (lesson 09): each MoE block holds a router (E·h) and E experts of 2·h·f
    weights (+ f + h biases) in place of the dense MLP. active=True: the parameters one token's
    forward uses, the dense ones and k of the E experts in each MoE block (compute per token
    follows these; memory follows the total). For a dense model active is the total."""
    if isinstance(config, MLPConfig):
        return sum(math.prod(s) for s in _mlp_shapes(config).values())
    if not isinstance(config, GPTConfig):
        raise TypeError("count_params takes a GPTConfig or an MLPConfig (a MoEConfig is a "
                        f"GPTConfig), got {type(config).__name__}")
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    per_block = 12 * h * h + (13 * h if config.bias else 2 * h)  # no bias: LayerNorm scales only
    final_norm = 2 * h if config.bias else h
    lm_head = 0 if config.tie_embeddings else V * h
    total = V * h + T * h + L * per_block + final_norm + lm_head
    if not isinstance(config, MoEConfig):
        return total
    E, k, f = config.n_experts, config.top_k, config.ffn_hidden
    dense_mlp = 8 * h * h + (5 * h if config.bias else 0)  # fc 4h² + 4h, proj 4h² + h
    expert = 2 * h * f + (f + h if config.bias else 0)
    used = k if active else E  # experts a token runs through, or all that are held
    return total + len(config.moe_blocks) * (E * h + used * expert - dense_mlp)


# ---------------------------------------------------------------- model state (ZeRO)

# Bytes per parameter of ZeRO's three model-state parts, by precision. Mixed precision keeps fp16
# (2-byte) parameters and gradients and K = 12 bytes of optimizer state (fp32 master weights,
# Adam momentum and variance, 4 bytes each); plain fp32 training keeps 4-byte parameters and
# gradients, and Adam needs K = 8 (momentum and variance).
PRECISIONS = {
    "mixed": {"params": 2, "grads": 2, "K": 12},
    "fp32": {"params": 4, "grads": 4, "K": 8},
}

# Which parts each ZeRO stage partitions over the data-parallel ranks (Rajbhandari et al.,
# Figure 1): stage 1 P_os, stage 2 P_os+g, stage 3 P_os+g+p. Stage 0 is plain data parallel.
ZERO_PARTITIONS = {
    0: (),
    1: ("optimizer",),
    2: ("optimizer", "grads"),
    3: ("optimizer", "grads", "params"),
}


def model_state_bytes(n_params, *, dp=1, zero_stage=0, mixed_precision=True, K=None):
    """Bytes of model state one data-parallel rank holds, as `MemoryParts` (params, grads,
    optimizer); ZeRO's accounting (Rajbhandari et al. 2019, Section 3.1 and Figure 1).

    n_params: Ψ. dp: N_d, the data-parallel ranks. zero_stage: 0 (plain DP), 1, 2 or 3.
    mixed_precision: fp16/bf16 params and grads with fp32 optimizer state (2 + 2 + K bytes per
    parameter, K = 12); False: plain fp32 training (4 + 4 + K, K = 8). K: override the
    optimizer-state bytes per parameter (for example 4 for SGD with momentum in fp32).
    A partitioned part is divided by N_d on every rank.
    """
    _check_model_state_args(n_params, dp, zero_stage, K)
    per_param = dict(PRECISIONS["mixed" if mixed_precision else "fp32"])
    if K is not None:
        per_param["K"] = K
    parts = MemoryParts(params=per_param["params"] * n_params,
                        grads=per_param["grads"] * n_params,
                        optimizer=per_param["K"] * n_params)
    for name in ZERO_PARTITIONS[zero_stage]:
        setattr(parts, name, getattr(parts, name) / dp)
    return parts


def _check_model_state_args(n_params, dp, zero_stage, K):
    if not n_params > 0:
        raise ValueError(f"n_params (Ψ) must be a positive number of parameters, got {n_params!r}")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp (N_d) must be a whole number of data-parallel ranks >= 1, got {dp!r}")
    if zero_stage not in ZERO_PARTITIONS:
        raise ValueError(f"zero_stage must be one of {sorted(ZERO_PARTITIONS)}, got {zero_stage!r}")
    if K is not None and not K >= 0:
        raise ValueError(f"K is bytes of optimizer state per parameter, >= 0; got {K!r}")


# ---------------------------------------------------------------- activations (Korthikanti)

# Korthikanti et al. 2022, Table 2, in units of s·b·h bytes, as functions of t (tensor-parallel
# size) and x = a·s/h. e: bytes of one stored value (2: fp16/bf16); m: bytes of one dropout-mask
# element (1). With e=2, m=1 every row is the paper's: "none" without sequence parallelism is
# 10 + 24/t + 5as/(ht), which at t=1 is 34 + 5as/h. The 10 = 4e + 2m are the LayerNorm inputs
# (2 values), the QKV and MLP inputs (2) and two dropout masks; 24 = 12e are Q, K, V, the
# projection input, and the 4h-wide GELU input and output; 5 = 2e + m per attention score are
# the softmax output, its dropout mask and the dropout output.
ACTIVATION_FORMULAS = {
    ("none", False): lambda t, x, e, m: 4 * e + 2 * m + 12 * e / t + (2 * e + m) * x / t,
    ("none", True): lambda t, x, e, m: (16 * e + 2 * m) / t + (2 * e + m) * x / t,
    ("selective", False): lambda t, x, e, m: 4 * e + 2 * m + 12 * e / t,
    ("selective", True): lambda t, x, e, m: (16 * e + 2 * m) / t,
    # Full recomputation keeps only each layer's input: sbh·2 in the table. With sequence
    # parallelism that input is itself split along the sequence over the t ranks.
    ("full", False): lambda t, x, e, m: e,
    ("full", True): lambda t, x, e, m: e / t,
}


def activation_bytes(seq_len, batch, hidden, heads, layers=1, tp=1, sequence_parallel=False,
                     recompute="none", *, bytes_per_value=2, mask_bytes=1):
    """Bytes of activations stored for backward by `layers` transformer layers on one rank;
    Korthikanti et al. 2022, Table 2 (s = seq_len, b = batch, h = hidden, a = heads, t = tp).

    recompute: "none", "selective" (attention scores recomputed) or "full" (only each layer's
    input kept). The defaults (16-bit values, 1-byte dropout masks) give the paper's numbers,
    for example sbh(34 + 5as/h) per layer with no parallelism and no recomputation.
    """
    for name, value in {"seq_len": seq_len, "batch": batch, "hidden": hidden, "heads": heads,
                        "layers": layers, "tp": tp}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"activation_bytes: {name} must be a whole number >= 1, got {value!r}")
    if (recompute, bool(sequence_parallel)) not in ACTIVATION_FORMULAS:
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    per_sbh = ACTIVATION_FORMULAS[recompute, bool(sequence_parallel)]
    x = heads * seq_len / hidden  # a·s/h: attention-score values per hidden value
    return seq_len * batch * hidden * per_sbh(tp, x, bytes_per_value, mask_bytes) * layers
