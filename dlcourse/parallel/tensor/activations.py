"""The activations one tensor-parallel rank saves for backward, tensor by tensor (lesson 04,
`lessons/04_tensor_parallel.ipynb`): lesson 01's estimator (`dlcourse/memory/estimate.py`)
with each tensor's share of the work on one of t ranks.

Korthikanti et al. (2022), Table 2, per layer in s·b·h bytes with 2-byte values and 1-byte masks:
    tensor parallel:            10 + 24/t + 5as/(ht)
    tensor + sequence parallel: 34/t + 5as/(ht)
This course GPT, as it runs here, differs in four ways, each a row below: fp32 values and no
dropout (dropout 0 saves no masks and no dropout output); LayerNorm's mean and 1/std and the causal
mask (lesson 01); the vocabulary-parallel embedding and loss save token ids and masks; and under
sequence parallelism the all-gathered inputs of the qkv and fc matmuls are saved whole, (b, s, h),
where Megatron saves the shard and all-gathers it again in backward (one more all-gather per
matmul for sbh·2·e/t fewer bytes). `measure_activations` checks the sum against the real thing.
"""

from dlcourse.memory.estimate import SavedTensorEstimate
from dlcourse.memory.measure import SavedTensorLog


def tp_saved_tensors(config, batch, tp, sequence_parallel=False):
    """Every tensor one rank of `TensorParallelGPT` saves in a forward and the vocabulary-parallel
    loss, fp32 on CPU, dropout 0, as `SavedTensorEstimate` rows (the batch is not counted)."""
    if config.dropout:
        raise ValueError("tp_saved_tensors counts dropout 0 only (the proofs' setting); "
                         f"got dropout {config.dropout}")
    B, T, h, a, V, L = (batch, config.seq_len, config.hidden, config.n_heads, config.vocab_size,
                        config.n_layers)
    BT, t = B * T, tp
    s = t if sequence_parallel else 1  # the LayerNorm regions hold T/s tokens
    block = [("ln1 input", BT * h // s, 4), ("ln1 mean and 1/std", 2 * BT // s, 4),
             ("qkv input (whole sequence)", BT * h, 4),
             ("q, k, v of a/t heads", 3 * BT * h // t, 4), ("causal mask (bool)", T * T, 1),
             ("softmax output of a/t heads", B * a // t * T * T, 4),
             ("proj input", BT * h // t, 4),
             ("ln2 input", BT * h // s, 4), ("ln2 mean and 1/std", 2 * BT // s, 4),
             ("fc input (whole sequence)", BT * h, 4), ("GELU input", 4 * BT * h // t, 4),
             ("mlp proj input", 4 * BT * h // t, 4)]
    rows = [SavedTensorEstimate("embedding", "this rank's token ids (int64)", BT, 8),
            SavedTensorEstimate("embedding", "ids outside this rank (bool)", BT, 1),
            SavedTensorEstimate("embedding", "position ids (int64)", T // s, 8)]
    rows += [SavedTensorEstimate("block", what, numel, size, L) for what, numel, size in block]
    rows += [SavedTensorEstimate("head", "ln_f input", BT * h // s, 4),
             SavedTensorEstimate("head", "ln_f mean and 1/std", 2 * BT // s, 4),
             SavedTensorEstimate("head", "lm_head input (whole sequence)", BT * h, 4),
             SavedTensorEstimate("loss", "softmax of V/t columns (fp32)", BT * V // t, 4),
             SavedTensorEstimate("loss", "this rank's target ids (int64)", BT, 8),
             SavedTensorEstimate("loss", "targets outside this rank (bool)", BT, 1)]
    return rows


def measure_activations(model, inputs, targets, loss_fn):
    """Bytes of activations this rank's forward and loss save for backward (lesson 01's
    `SavedTensorLog`), and the log's records; runs backward afterwards to free them."""
    with SavedTensorLog(model, ignore=(inputs, targets)) as log:
        loss = loss_fn(model(inputs), targets)
    held = log.live_bytes()["activations"]
    loss.backward()
    return held, log.records


def table2_differences(config, batch, tp, sequence_parallel=False):
    """How one layer of `tp_saved_tensors` differs from Korthikanti's Table 2 with 4-byte values
    and no masks (`activation_bytes(..., bytes_per_value=4, mask_bytes=0)`): {reason: bytes},
    which sum to ours - theirs."""
    B, T, h, a, t = batch, config.seq_len, config.hidden, config.n_heads, tp
    s = t if sequence_parallel else 1
    out = {"no dropout output after the softmax": -4 * B * a * T * T // t,
           "LayerNorm mean and 1/std (2 LayerNorms)": 2 * 2 * B * T // s * 4,
           "causal mask (bool)": T * T}
    if sequence_parallel:  # qkv and fc inputs saved whole, not as the 1/t shard
        out["gathered qkv and fc inputs saved whole"] = 2 * 4 * B * T * h * (t - 1) // t
    return out
