"""Does it fit? Bytes per GPU for real models, from the papers' formulas (lesson 01).

    memory_per_gpu(REAL_MODELS["Llama-2 7B"], batch=1, seq_len=4096, dp=8, zero_stage=3)
    fits(parts)     # {"24 GB": False, "40 GB": ..., "80 GB": ..., "141 GB": ...}

Model state is ZeRO's accounting (`model_state_bytes`); activations are Korthikanti et al.'s
per-layer formula (`activation_bytes`), written for GPT's layer (4h GELU MLP, every head with
its own keys and values). For Llama's SwiGLU MLP and grouped-query attention it is an
approximation (lesson 07's planner counts each model's own layer: `dlcourse.planner.activations`).
Added to it: the fp32 log-probabilities the loss keeps, 4·s·b·V bytes, which
the course GPT's measurement shows are not small when the vocabulary is large. Not counted:
temporary buffers, the CUDA context and allocator fragmentation, so leave some headroom.
"""

from dataclasses import dataclass

from dlcourse.memory.accounting import activation_bytes, model_state_bytes


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a published model, enough to count its parameters and activations."""

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    seq_len: int  # the context it was trained with
    ffn: int  # width of the MLP's hidden layer
    kv_heads: int  # heads with their own keys and values (fewer than n_heads: grouped-query)
    gated_mlp: bool  # SwiGLU: three h x ffn matrices instead of two
    bias: bool  # biases in Linear layers and LayerNorm
    tied: bool  # output layer shares the token embedding
    learned_positions: bool  # a position-embedding table (GPT-2) instead of rotary (Llama)
    dropout: bool = False  # dropout after attention probs, attention output and MLP (GPT-2, GPT-3)


_GPT2 = dict(vocab_size=50257, seq_len=1024, gated_mlp=False, bias=True, tied=True,
             learned_positions=True, dropout=True)  # GPT-2: dropout 0.1
_LLAMA2 = dict(vocab_size=32000, seq_len=4096, gated_mlp=True, bias=False, tied=False,
               learned_positions=False)

# GPT-2 (Radford et al. 2019) and Llama 2 (Touvron et al. 2023), as published.
REAL_MODELS = {spec.name: spec for spec in [
    ModelSpec("GPT-2 small", 12, 768, 12, ffn=3072, kv_heads=12, **_GPT2),
    ModelSpec("GPT-2 medium", 24, 1024, 16, ffn=4096, kv_heads=16, **_GPT2),
    ModelSpec("GPT-2 large", 36, 1280, 20, ffn=5120, kv_heads=20, **_GPT2),
    ModelSpec("GPT-2 XL", 48, 1600, 25, ffn=6400, kv_heads=25, **_GPT2),
    ModelSpec("Llama-2 7B", 32, 4096, 32, ffn=11008, kv_heads=32, **_LLAMA2),
    ModelSpec("Llama-2 13B", 40, 5120, 40, ffn=13824, kv_heads=40, **_LLAMA2),
    ModelSpec("Llama-2 70B", 80, 8192, 64, ffn=28672, kv_heads=8, **_LLAMA2),
]}

CARDS_GB = (24, 40, 80, 141)  # memory of common GPUs as sold: RTX 4090, A100 40/80, H200


def spec_params(spec):
    """Ψ of a `ModelSpec`: embeddings, L layers (attention, MLP, two norms), final norm, head."""
    h, f = spec.hidden, spec.ffn
    kv = spec.kv_heads * (h // spec.n_heads)  # width of the keys (and of the values)
    attention = h * h + 2 * h * kv + h * h  # q, k, v, output projection
    mlp = (3 if spec.gated_mlp else 2) * h * f
    norm = 2 * h if spec.bias else h  # LayerNorm has a bias; RMSNorm only a scale
    if spec.bias:
        attention += h + 2 * kv + h
        mlp += f + h
    embeddings = spec.vocab_size * h + (spec.seq_len * h if spec.learned_positions else 0)
    head = 0 if spec.tied else spec.vocab_size * h
    return embeddings + spec.n_layers * (attention + mlp + 2 * norm) + norm + head


def memory_per_gpu(spec, *, batch=1, seq_len=None, mixed_precision=True, dp=1, zero_stage=0,
                   recompute="none"):
    """Bytes one GPU holds to train `spec` on `batch` sequences of `seq_len` tokens (default:
    the model's context), as `MemoryParts`: ZeRO model state plus activations."""
    seq_len = seq_len or spec.seq_len
    parts = model_state_bytes(spec_params(spec), dp=dp, zero_stage=zero_stage,
                              mixed_precision=mixed_precision)
    layers = activation_bytes(seq_len, batch, spec.hidden, spec.n_heads, layers=spec.n_layers,
                              recompute=recompute, bytes_per_value=2 if mixed_precision else 4)
    log_probs = 4 * seq_len * batch * spec.vocab_size  # fp32, kept by the loss for backward
    parts.activations = layers + log_probs
    return parts


def fits(parts, cards=CARDS_GB):
    """{card size in GB: True if `parts.total` fits in it}; GB = 10^9 bytes, as in ZeRO."""
    return {gb: parts.total <= gb * 1e9 for gb in cards}
