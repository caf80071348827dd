"""The models the planner knows by name (lesson 07): lesson 01's GPT-2 and Llama 2 shapes, the
published models it is checked against (`published_runs.py`), and four mixtures of experts
(lesson 09, `moe_spec.MoESpec`): Mixtral 8x7B and 8x22B, DeepSeek-V3 and Qwen3-235B-A22B.

    model("llama-2-7b")    # case, spaces and underscores ignored
"""

from dlcourse.memory.calculator import REAL_MODELS, ModelSpec
from dlcourse.planner.moe_spec import MoESpec


def megatron_gpt(name, heads, hidden, layers):
    """A GPT as Narayanan et al. 2021 train it: 4h MLP, vocabulary 51,200, 2,048 tokens,
    Megatron-LM's default dropout (0.1, which Korthikanti et al. 2022 count)."""
    return ModelSpec(name, layers, hidden, heads, vocab_size=51200, seq_len=2048,
                     ffn=4 * hidden, kv_heads=heads, gated_mlp=False, bias=True, tied=True,
                     learned_positions=True, dropout=True)


# Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3: 126 layers, width 16,384, FFN
# 53,248, 128 heads with 8 key/value heads, vocabulary 128,000 (128,256 with special tokens).
LLAMA3_405B = ModelSpec("Llama-3 405B", 126, 16384, 128, vocab_size=128256, seq_len=8192,
                        ffn=53248, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                        learned_positions=False)

# Llama 3.1 8B as torchtitan builds it (pytorch/torchtitan 9dec370, 2024-12-26, the commit of
# its H100 benchmarks: torchtitan/models/llama/__init__.py "8B" and model.py FeedForward): 32
# layers, dim 4,096, 32 heads, 8 key/value heads, ffn 1,024 x ceil(int(1.3 x int(2/3 x 4 x
# 4,096)) / 1,024) = 14,336; the tiktoken vocabulary of 128,256; untied output head.
LLAMA31_8B = ModelSpec("Llama-3.1 8B", 32, 4096, 32, vocab_size=128256, seq_len=8192,
                       ffn=14336, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                       learned_positions=False)

# Jiang et al. 2024, "Mixtral of Experts", Table 1: dim 4,096, 32 layers, head_dim 128, hidden
# 14,336, 32 heads, 8 K/V heads, context 32,768, vocabulary 32,000, 8 experts, top-2; every
# layer's MLP is an MoE of SwiGLU experts; untied head, rotary positions, RMSNorm. §2: 47B
# parameters, 13B active a token (`moe_spec` counts 46.70B and 12.88B). Trained length not
# published: the 4,096 of Mistral 7B is taken as the planner's default sequence.
# Dropless, the busiest of its 8 experts gets MIXTRAL_IMBALANCE x the mean rows: calibrated on
# Megatron-Core's Mixtral 8x22B pair, dropless against forced balance (`published_moe.
# MIXTRAL_PAIR`, `pair_imbalance` finds 1.06), held out on its Mixtral 8x7B run.
MIXTRAL_IMBALANCE = 1.06
MIXTRAL_8X7B = MoESpec("Mixtral 8x7B", 32, 4096, 32, vocab_size=32000, seq_len=4096,
                       ffn=14336, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                       learned_positions=False, n_experts=8, top_k=2, moe_ffn=14336,
                       dropless_imbalance=MIXTRAL_IMBALANCE)

# Mixtral 8x22B: mistral-community/Mixtral-8x22B-v0.1 config.json (42a1ba7, the base model's)
# and Megatron-Core's MoE model zoo (yanring/Megatron-MoE-ModelZoo 38ce2ed, 2026-03-10,
# model_configs/benchmarking/Mixtral-8x22B.yaml) agree: 56 layers, hidden 6,144, 48 heads of
# 128 with 8 key/value groups, 8 SwiGLU experts of width 16,384 in every layer, top-2, RMSNorm,
# rotary positions, untied head, vocabulary 32,000 (the zoo's Llama 2 tokenizer, already a
# multiple of its 128 x tp padding). `moe_spec` counts 140.6B total, 39.2B active (Mistral
# AI's announcement, as the NeMo Framework user guide's Mixtral page quotes it: "39B active
# parameters out of 141B"). Sequence: 4,096, the zoo's.
MIXTRAL_8X22B = MoESpec("Mixtral 8x22B", 56, 6144, 48, vocab_size=32000, seq_len=4096,
                        ffn=16384, kv_heads=8, gated_mlp=True, bias=False, tied=False,
                        learned_positions=False, n_experts=8, top_k=2, moe_ffn=16384,
                        dropless_imbalance=MIXTRAL_IMBALANCE)


def mla_params(dim, n_heads, q_rank, kv_rank, nope, rope, v_dim):
    """One layer of multi-head latent attention (DeepSeek-V3's inference/model.py `MLA`):
    wq_a (dim x q_rank), q_norm, wq_b (q_rank x heads (nope + rope)), wkv_a (dim x (kv_rank +
    rope)), kv_norm, wkv_b (kv_rank x heads (nope + v)), wo (heads v x dim)."""
    return (dim * q_rank + q_rank + q_rank * n_heads * (nope + rope) + dim * (kv_rank + rope)
            + kv_rank + kv_rank * n_heads * (nope + v_dim) + n_heads * v_dim * dim)


# DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §4.2 and deepseek-ai/DeepSeek-V3 9b4e978
# (2025-08-28) inference/configs/config_671B.json: dim 7,168, 61 layers, the first 3 dense
# (inter_dim 18,432), then 256 routed experts (moe_inter_dim 2,048) and 1 shared, 8 activated,
# 128 heads of MLA (q_lora_rank 1,536, kv_lora_rank 512, 128 + 64 query/key dims, 128 value
# dims: `mla_params`), vocabulary 129,280, untied head; pre-trained at 4,096 tokens (§4.2).
# 671B total, 37B active (`moe_spec` counts 671.03B and 37.55B; the report's 671B leaves out
# the 14B multi-token-prediction module, and so does this spec; the router's 256-value
# balancing bias, no trained weight, is left out too). Attention elsewhere in the planner is
# approximated as 128 heads of 56 (see `moe_spec`) but for the score FLOPs (`head_dims`:
# 128 + 64 query/key and 128 value dims); n_limited_groups 4 is the node-limited routing.
DEEPSEEK_V3 = MoESpec("DeepSeek-V3", 61, 7168, 128, vocab_size=129280, seq_len=4096,
                      ffn=18432, kv_heads=128, gated_mlp=True, bias=False, tied=False,
                      learned_positions=False, n_experts=256, top_k=8, moe_ffn=2048,
                      n_shared_experts=1, first_dense=3,
                      attention_params=mla_params(7168, 128, 1536, 512, 128, 64, 128),
                      head_dims=(128 + 64, 128), route_nodes=4)  # n_limited_groups 4

# Qwen3-235B-A22B as Megatron-Core's MoE model zoo trains it (yanring/Megatron-MoE-ModelZoo
# 798dfb5, 2026-05-13, model_configs/benchmarking/Qwen3-235B-A22B.yaml): 94 layers, hidden
# 4,096, 64 query heads of 128 (kv-channels) with 4 key/value groups and per-head q/k RMSNorm
# (qk-layernorm), 128 experts of width 1,536, top-8, every layer MoE, no shared expert,
# SwiGLU, RMSNorm, rotary positions, untied head, vocabulary padded to 1,187 x 128 = 151,936.
# `moe_spec` counts 235.1B total, 22.2B active (the name's 235B and A22B).
QWEN3_235B = MoESpec("Qwen3-235B-A22B", 94, 4096, 64, vocab_size=151936, seq_len=4096,
                     ffn=12288, kv_heads=4, gated_mlp=True, bias=False, tied=False,
                     learned_positions=False, n_experts=128, top_k=8, moe_ffn=1536,
                     attention_params=2 * 4096 * 64 * 128 + 2 * 4096 * 4 * 128 + 2 * 128,
                     head_dims=(128, 128))

MODELS = {**REAL_MODELS, LLAMA3_405B.name: LLAMA3_405B, LLAMA31_8B.name: LLAMA31_8B,
          MIXTRAL_8X7B.name: MIXTRAL_8X7B, MIXTRAL_8X22B.name: MIXTRAL_8X22B,
          DEEPSEEK_V3.name: DEEPSEEK_V3,
          QWEN3_235B.name: QWEN3_235B}


def _key(name):
    return name.lower().replace(" ", "-").replace("_", "-")


def model(name):
    """The `ModelSpec` called `name`, or a ValueError listing the known names."""
    known = {_key(n): spec for n, spec in MODELS.items()}
    if _key(name) not in known:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known)}")
    return known[_key(name)]
