"""What one layer of a mixture of experts saves for backward on one GPU, tensor by tensor, and
what a run's recomputation and low-precision caching take off it (lesson 09's planner; issue 34).

    moe_layer_rows(work, L, recipe)   # [(tensor, kind, bytes)] an MoE layer, one micro-batch
    dense_layer_rows(work, L, recipe) # the same for a dense layer of the model (DeepSeek-V3's 3)
    saved_bytes(work, L, recipe)      # the larger layer's sum: what the planner counts a layer
    course_extra_rows(work, L, e)     # what lesson 09's own layer keeps beyond those rows

The attention's and the norms' rows are the dense planner's (`activations.layer_saved_tensors`),
each given a kind below; with `head_dims` the queries and the attention output are n_heads x
d wide, not h (Qwen3's 64 heads of 128 on h = 4096; DeepSeek-V3's MLA, 128 heads of 192 and
128). The MoE rows are the busiest rank's routed rows (`moe_cost.routed_rows`), each saving the
expert's input (h), its output (h, for the gradient of its combine weight, as lesson 09's
`combine` does; with `Recipe.probs_in_activation`, Megatron-Core's, one fp32 weight instead)
and its MLP's ffn-wide tensors; the router's fp32 logits and probabilities (2 E a token); the
shared experts as one MLP of their width on every token, reading the MLP input already counted.

A `Recipe` (`moe_cost.py`) takes rows off as the run did, each from its source:
- `recompute_modules`: Megatron-Core's --recompute-modules names (selective granularity):
  "layernorm" recomputes the norms, so their outputs (the inputs of QKV and of the MLP) and
  statistics are not stored; "moe_act" recomputes the experts' activation, so its output (the
  down projection's input) is not; "mla_up_proj" recomputes MLA's up-projections, so Q, K, V
  are not (DeepSeek-V3 report §3.2.3 does "layernorm" and "mla_up_proj"; its §3.3.3 also
  "recompute[s] its [SwiGLU's] output", "moe_act");
- `fp8_activations`: DeepSeek-V3 §3.3.3, "cache activations in FP8 format for the backward
  pass of the Linear operator": a Linear's input 1 byte a value, the attention output (the
  Linear after attention) in its "customized E5M6" format, 12 bits, and the SwiGLU input in
  FP8; norms, attention's own tensors, the router and the combine (expert outputs) keep
  bf16/fp32 (§3.3.1: "normalization operators, and attention operators", "MoE gating"; §3.3.3:
  "combine components ... in BF16").
"""

from dataclasses import replace

from dlcourse.planner.activations import layer_saved_tensors
from dlcourse.planner.moe_cost import BYTES, Recipe, rank_tokens, routed_rows

# the dense planner's row names, by kind
KINDS = {"norm 1 input": "norm input", "norm 2 input": "norm input",
         "norm 1 statistics (fp32)": "norm statistics",
         "norm 2 statistics (fp32)": "norm statistics",
         "QKV input": "norm output", "MLP input": "norm output", "Q, K, V": "Q, K, V",
         "output projection input": "attention output",
         "gate and up, side by side (the fused SwiGLU's input)": "activation input",
         "gate x W_gate (SiLU's input)": "activation input",
         "SiLU output (a factor of the product)": "activation input",
         "up x W_up (the other factor)": "activation input",
         "x W_fc (GELU's input)": "activation input",
         "product (down projection's input)": "activation output",
         "SwiGLU output (down projection's input)": "activation output",
         "GELU output (down projection's input)": "activation output"}
RECOMPUTED = {"layernorm": {"norm output", "norm statistics"},  # Megatron-Core's names
              "moe_act": {"activation output"},
              "mla_up_proj": {"Q, K, V"}}
FP8_BYTES = {"norm output": 1, "expert input": 1, "activation input": 1,
             "activation output": 1, "attention output": 1.5}  # DeepSeek-V3 §3.3.3; E5M6


def _attention_rows(work, L, spec, e=BYTES, **cpu):
    """The dense planner's rows of `spec`'s layer, kinds given, head_dims widths applied;
    `e` bytes a value, `cpu` its mask_bytes and stat_bytes (torch's CPU kernels: e each)."""
    rows = layer_saved_tensors(spec, work.seq_len // L.cp, L.micro_batch, tp=L.tp,
                               sequence_parallel=L.sequence_parallel, recompute=L.recompute,
                               attention=work.attention, mlp=work.mlp, bytes_per_value=e, **cpu)
    rows = [(name, KINDS.get(name, name), nbytes) for name, nbytes, _ in rows if nbytes]
    if spec.head_dims is None:
        return rows
    h, H, kv = spec.hidden, spec.n_heads, spec.kv_heads * (spec.hidden // spec.n_heads)
    d_qk, d_v = spec.head_dims
    width = {"Q, K, V": (H * d_qk + spec.kv_heads * (d_qk + d_v)) / (h + 2 * kv),
             "attention output": H * d_v / h}
    return [(name, kind, nbytes * width.get(kind, 1)) for name, kind, nbytes in rows]


def _mlp_rows(spec, rows, width, mlp, who, e=BYTES):
    """An MLP's ffn-wide tensors for `rows` rows of inner width `width`, `e` bytes a value."""
    if not spec.gated_mlp:
        return [(f"{who}: GELU input", "activation input", rows * width * e),
                (f"{who}: GELU output", "activation output", rows * width * e)]
    inputs = 2 if mlp == "fused" else 3  # (gate, up) side by side; or gate, SiLU out, up
    return [(f"{who}: SwiGLU input", "activation input", rows * inputs * width * e),
            (f"{who}: SwiGLU output (down projection's input)", "activation output",
             rows * width * e)]


def router_bytes(e):
    """Bytes a router value: float32, or the model's dtype if wider (lesson 09's
    `router_logits`, after Switch's selective precision)."""
    return max(4, e)


def _combine_weight_rows(rows, h, e, recipe):
    """What the gradient of a routed row's combine weight keeps. Lesson 09's `combine`
    multiplies the expert's h-wide output by it, so that output is kept; with
    `recipe.probs_in_activation` (Megatron-Core's experts, d98e8a6: experts.py's TEGroupedMLP
    passes the probs to weighted_bias_swiglu_impl, and unpermute gets none) the weight
    multiplies the activation's output instead, whose backward finds the gradient from
    tensors already kept (or recomputed); its WeightedSwiGLUFunction saves the weights, one
    fp32 value a row (fusions/fused_bias_swiglu.py)."""
    if recipe.probs_in_activation:
        return [("routed rows' weights (fp32)", "router", rows * 4)]
    return [("experts' output (routed rows, the combine's weights)", "expert output",
             rows * h * e)]


def _expert_rows(work, L, e=BYTES, recipe=Recipe()):
    spec = work.model
    tokens = rank_tokens(L, work.seq_len)
    rows = routed_rows(spec, tokens, L.ep)
    out = [("experts' input (routed rows)", "expert input", rows * spec.hidden * e)]
    out += _combine_weight_rows(rows, spec.hidden, e, recipe)
    out += _mlp_rows(spec, rows, spec.moe_ffn, work.mlp, "experts", e)
    router = spec.n_experts * tokens * router_bytes(e)  # (N, E) fp32: the z-loss's, softmax's
    out += [("router logits (fp32)", "router", router),
            ("router probabilities (fp32)", "router", router)]
    if spec.n_shared_experts:
        out += _mlp_rows(spec, tokens, spec.n_shared_experts * spec.moe_ffn, work.mlp,
                         "shared experts", e)
    return out


def course_extra_rows(work, L, e=BYTES):
    """[(tensor, kind, bytes)] what lesson 09's `MoE` keeps beyond the planner's rows, measured
    with lesson 01's SavedTensorLog (tests/test_planner_moe_memory.py), all kind "routing":
    - the weighted expert outputs, y x weight (rows, h): `combine`'s index_add keeps its
      source (torch's tools/autograd/derivatives.yaml: the source's gradient is
      grad.index_select(dim, index).expand_as(source)). Megatron-Core's unfused unpermute
      (moe_utils.py at d98e8a6) calls index_add_ only under deterministic algorithms, and
      otherwise scatter_add_, whose src gradient grad.gather(dim, index) keeps the index;
    - small ones, O(tokens x k) not O(rows x h), which the planner leaves out as Korthikanti
      leaves out the norms' statistics: the top-k weights (N, k) and their sum (N, 1) (the
      renormalising division), the top-k expert ids (N, k) int64, the sorted rows' order and
      tokens (rows,) int64 each (the gathers), the sorted weights (rows, 1), the mean
      probabilities P (E,) of the balance loss and the z-loss's logsumexp (N,)."""
    spec = work.model
    N, k, E = rank_tokens(L, work.seq_len), spec.top_k, spec.n_experts
    rows, r = routed_rows(spec, N, L.ep), router_bytes(e)
    return [("weighted experts' output (combine's index_add source)", "routing",
             rows * spec.hidden * e),
            ("top-k weights", "routing", N * k * r), ("top-k weights' sum", "routing", N * r),
            ("top-k expert ids (int64)", "routing", N * k * 8),
            ("sorted rows' order (int64)", "routing", rows * 8),
            ("sorted rows' tokens (int64)", "routing", rows * 8),
            ("sorted rows' weights", "routing", rows * r),
            ("balance loss's mean probabilities", "routing", E * r),
            ("z-loss's logsumexp", "routing", N * r)]


def _apply(rows, recipe):
    """Drop what `recipe` recomputes; store what it caches in low precision at its bytes."""
    dropped = set().union(*(RECOMPUTED[m] for m in recipe.recompute_modules))
    scale = {k: b / BYTES for k, b in FP8_BYTES.items()} if recipe.fp8_activations else {}
    return [(name, kind, nbytes * scale.get(kind, 1)) for name, kind, nbytes in rows
            if kind not in dropped]


def moe_layer_rows(work, L, recipe=Recipe(), e=BYTES, **cpu):
    """[(tensor, kind, bytes)] one MoE layer saves for one micro-batch on the busiest GPU;
    `e` bytes a value (bf16: 2; the course measures float32 and float64), `cpu` the dense
    planner's mask_bytes and stat_bytes."""
    no_mlp = replace(work.model, ffn=0)  # attention, norms and the MLP's (router's) input
    rows = _attention_rows(work, L, no_mlp, e, **cpu)
    if L.recompute != "full":
        rows += _expert_rows(work, L, e, recipe)
    return _apply(rows, recipe)


def dense_layer_rows(work, L, recipe=Recipe()):
    """[(tensor, kind, bytes)] one dense layer (an MLP `ffn` wide) saves, `recipe` applied."""
    return _apply(_attention_rows(work, L, work.model), recipe)


def saved_bytes(work, L, recipe=Recipe()):
    """Bytes the larger of an MoE and a dense layer saves for one micro-batch on one GPU."""
    spec = work.model
    moe = sum(b for *_, b in moe_layer_rows(work, L, recipe))
    has_dense = spec.first_dense or spec.moe_every > 1
    return max(moe, sum(b for *_, b in dense_layer_rows(work, L, recipe)) if has_dense else 0)
