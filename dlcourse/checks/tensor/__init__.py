"""Checks for lesson 04's exercises (`exercises/04_tensor_parallel.ipynb`): tensor parallelism by
hand.

    check_column_parallel_linear(column_parallel_linear)  W cut by rows, outputs all-gathered
    check_row_parallel_linear(row_parallel_linear)        W cut by columns, summed, bias once
    check_f(MegatronF)                                    identity forward, all-reduce backward
    check_g(MegatronG)                                    all-reduce forward, identity backward
    check_qkv_shard(qkv_shard)                            a rank's heads of the fused q, k, v
    check_vocab_parallel_cross_entropy(...)               the loss without gathering the logits
    check_sequence_parallel(GatherSequence, ReduceScatterSequence)  SP's conversion pair
    check_layernorm_grads(sync_layernorm_grads)           SP's LayerNorm gradients summed over tp

One module per exercise: `column_parallel_linear.py`, `row_parallel_linear.py`, `megatron_f.py`,
`megatron_g.py`, `qkv_shard.py`, `vocab_parallel_cross_entropy.py` (the loss),
`sequence_parallel.py` (the pair) and `sync_layernorm_grads.py`; the layer the first four draw and
run in `layers.py`, the sequence-parallel block in `sequence_block.py`, tp sizes and seeds in
`cases.py`. Every check runs the student's code on 2, 3 and 4 real ranks (in a random order) with
sizes, biases and values drawn afresh on each run (`core.fresh_cases`) from a seed that a failure
prints (`seed=` replays it), in float64, and compares every rank's output (and, for f and g, every
gradient) with one process running `nn.Linear` on the whole tensors. While the student's code runs
the lesson's `dlcourse.parallel.tensor` and torch's DTensor tensor parallelism are refused
(`answers.py`).
"""

from dlcourse.checks.tensor.column_parallel_linear import check_column_parallel_linear
from dlcourse.checks.tensor.megatron_f import check_f
from dlcourse.checks.tensor.megatron_g import check_g
from dlcourse.checks.tensor.qkv_shard import check_qkv_shard
from dlcourse.checks.tensor.row_parallel_linear import check_row_parallel_linear
from dlcourse.checks.tensor.sequence_parallel import check_sequence_parallel
from dlcourse.checks.tensor.sync_layernorm_grads import check_layernorm_grads
from dlcourse.checks.tensor.vocab_parallel_cross_entropy import check_vocab_parallel_cross_entropy

__all__ = ["check_column_parallel_linear", "check_row_parallel_linear", "check_f", "check_g",
           "check_qkv_shard", "check_vocab_parallel_cross_entropy", "check_sequence_parallel",
           "check_layernorm_grads"]
