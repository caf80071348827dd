"""Predict the memory of one training step of the course GPT, tensor by tensor (lesson 01).

    rows = gpt_saved_tensors(GPTConfig(), batch=8)      # every tensor autograd will save
    phases = estimate_gpt_step(GPTConfig(), batch=8)    # MemoryParts after init/forward/...

Korthikanti et al.'s sbh(34 + 5as/h) assumes 16-bit values and 1-byte dropout masks on a GPU.
The course GPT as it really runs here differs, and every difference is a row below: fp32 values
(4 bytes) unless autocast lowers the matmuls, dropout masks that CPU dropout stores as a random
tensor of the activations' dtype, LayerNorm's saved mean and 1/std, a causal mask per layer,
and the loss's fp32 log-probabilities. `measure_step` checks the sum against the real thing.
"""

from dataclasses import dataclass

import torch

from dlcourse.memory.accounting import MemoryParts, count_params, param_shapes
from dlcourse.models import GPTConfig

# Bytes per element of each kind of saved tensor, by (device type, autocast dtype or None):
#   residual: the residual stream, saved as LayerNorm input. Always fp32: the embeddings are
#             fp32 and fp32 + bf16 promotes to fp32.
#   compute:  matmul inputs and what follows a matmul (GELU input, ...): autocast's dtype.
#   softmax:  the attention probabilities softmax saves. CUDA autocast runs softmax in fp32.
#   mask:     a dropout mask. CPU dropout multiplies by a random tensor of the input's dtype;
#             CUDA's fused dropout keeps one bool per element.
# The CUDA rows follow torch's autocast op lists; they are checked only where a GPU runs the test.
DTYPE_RULES = {
    ("cpu", None): {"residual": 4, "compute": 4, "softmax": 4, "mask": 4},
    ("cpu", torch.bfloat16): {"residual": 4, "compute": 2, "softmax": 2, "mask": 2},
    ("cuda", None): {"residual": 4, "compute": 4, "softmax": 4, "mask": 1},
    ("cuda", torch.bfloat16): {"residual": 4, "compute": 2, "softmax": 4, "mask": 1},
    ("cuda", torch.float16): {"residual": 4, "compute": 2, "softmax": 4, "mask": 1},
}

# Optimizer state of torch's optimizers for fp32 parameters: bytes per parameter, and per
# parameter tensor (Adam's step count is a 4-byte tensor of its own for every parameter).
OPTIMIZER_STATE = {"adamw": (8, 4), "adam": (8, 4), "sgd": (0, 0)}


@dataclass
class SavedTensorEstimate:
    """One tensor (or `count` alike) the course GPT saves for backward."""

    where: str  # "block" (once per layer), "embedding", "head" or "loss"
    what: str
    numel: int  # elements of one such tensor
    itemsize: int  # bytes per element
    count: int = 1
    kind: str = "activations"  # or "weight_copies"

    @property
    def nbytes(self):
        return self.numel * self.itemsize * self.count


def gpt_saved_tensors(config, batch, *, seq_len=None, device="cpu", autocast_dtype=None):
    """Every tensor `GPT(config)` saves for backward in one step on `batch` sequences of
    `seq_len` tokens (default: config.seq_len), loss included, as `SavedTensorEstimate` rows.
    The batch itself (token ids and targets) is the caller's and is not counted."""
    rules = _rules(device, autocast_dtype)
    B, T, h, a = batch, seq_len or config.seq_len, config.hidden, config.n_heads
    BT, L = B * T, config.n_layers
    rows = [SavedTensorEstimate("embedding", "position ids (int64)", T, 8)]
    rows += [_as_block_row(r, L) for r in _block_rows(B, T, h, a, config.dropout > 0, rules)]
    rows += [
        SavedTensorEstimate("head", "ln_f input", BT * h, rules["residual"]),
        SavedTensorEstimate("head", "ln_f mean and 1/std", 2 * BT, 4),
        SavedTensorEstimate("head", "lm_head input", BT * h, rules["compute"]),
        SavedTensorEstimate("loss", "log-probabilities (fp32)", BT * config.vocab_size, 4),
        SavedTensorEstimate("loss", "sum of target weights (fp32)", 1, 4),
    ]
    if autocast_dtype is not None:  # autocast's low-precision weights (qkv 3h², proj h²,
        # fc 4h², proj 4h² per layer), kept for backward until the step ends
        rows += [SavedTensorEstimate("block", "Linear weights cast", 12 * h * h, rules["compute"],
                                     L, "weight_copies"),
                 SavedTensorEstimate("head", "lm_head weight cast", config.vocab_size * h,
                                     rules["compute"], 1, "weight_copies")]
    return rows


def _block_rows(B, T, h, a, dropout, rules):
    """(what, elements, kind of dtype) of one Block: attention, then MLP."""
    BT, scores = B * T, B * a * T * T  # scores: (B, a, T, T) attention probabilities
    rows = [("ln1 input", BT * h, "residual"), ("ln1 mean and 1/std", 2 * BT, 4),
            ("qkv input", BT * h, "compute"),
            ("q, k, v (contiguous per-head copies)", 3 * BT * h, "compute"),
            ("causal mask (bool)", T * T, 1),
            ("softmax output", scores, "softmax")]
    if dropout:
        rows.append(("attention dropout mask", scores, "mask"))
    # probs @ v saves its left input: dropout's output, or a cast copy of softmax's output when
    # the dtypes differ (CUDA autocast); otherwise it is softmax's output, a storage counted above.
    if dropout or rules["softmax"] != rules["compute"]:
        rows.append(("probs input of probs @ v", scores, "compute"))
    rows.append(("proj input", BT * h, "compute"))
    if dropout:
        rows.append(("residual dropout mask", BT * h, "mask"))
    rows += [("ln2 input", BT * h, "residual"), ("ln2 mean and 1/std", 2 * BT, 4),
             ("fc input", BT * h, "compute"), ("GELU input", 4 * BT * h, "compute"),
             ("mlp proj input", 4 * BT * h, "compute")]
    if dropout:
        rows.append(("MLP dropout mask", BT * h, "mask"))
    return [(what, numel, rules[size] if isinstance(size, str) else size)
            for what, numel, size in rows]


def _as_block_row(row, n_layers):
    what, numel, itemsize = row
    return SavedTensorEstimate("block", what, numel, itemsize, n_layers)


def _rules(device, autocast_dtype):
    device_type = torch.device(device).type
    if (device_type, autocast_dtype) not in DTYPE_RULES:
        known = ", ".join(f"({d!r}, {t})" for d, t in DTYPE_RULES)
        raise ValueError(f"no dtype rules for device {device_type!r} with autocast dtype "
                         f"{autocast_dtype}; known: {known}")
    return DTYPE_RULES[device_type, autocast_dtype]


def estimate_gpt_step(config, batch, *, seq_len=None, device="cpu", autocast_dtype=None,
                      optimizer="adamw"):
    """Predicted bytes held after each phase of one first training step of `GPT(config)` with
    fp32 parameters: {"init", "forward", "backward", "step"} -> MemoryParts, the phases of
    `measure_step`. Saved tensors are held from the forward until backward frees them; the
    optimizer's state appears at its first step."""
    if not isinstance(config, GPTConfig):
        raise TypeError(f"estimate_gpt_step takes a GPTConfig, got {type(config).__name__}")
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE)}, got {optimizer!r}")
    n_params = count_params(config)
    per_param, per_tensor = OPTIMIZER_STATE[optimizer]
    rows = gpt_saved_tensors(config, batch, seq_len=seq_len, device=device,
                             autocast_dtype=autocast_dtype)
    params = MemoryParts(params=4 * n_params)
    state = per_param * n_params + per_tensor * len(param_shapes(config))
    held = {kind: sum(r.nbytes for r in rows if r.kind == kind)
            for kind in ("activations", "weight_copies")}
    return {
        "init": params,
        "forward": MemoryParts(params=params.params, **held),
        "backward": MemoryParts(params=params.params, grads=4 * n_params),
        "step": MemoryParts(params=params.params, grads=4 * n_params,
                            optimizer=state),
    }
