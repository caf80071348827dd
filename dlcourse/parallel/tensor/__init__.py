"""Tensor parallelism (lesson 04, `lessons/04_tensor_parallel.ipynb`): every weight matrix is
split over the ranks of a tensor-parallel group, each rank computes its share of every layer, and
Megatron-LM's f and g operators (Shoeybi et al. 2019) stitch the shares together; sequence
parallelism (Korthikanti et al. 2022) also splits the LayerNorm regions along the sequence.

    comm.py         f, g, gather_sequence, reduce_scatter_sequence, gather_last_dim (autograd
                    Functions), and g_trap: g on torch's differentiable all-reduce, wrong on purpose
    layers.py       ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                    SequenceParallelLayerNorm, SequenceParallelPositions; shard / unshard
    loss.py         vocab_parallel_cross_entropy: the loss without gathering the logits
    parallelize.py  PLAN, parallelize(model, group, sequence_parallel) -> TensorParallelGPT,
                    check_tp, full_parameters
    measure.py      count_layer / layer_formula: one layer's collectives beside the papers';
                    param_bytes: Ψ/t plus what stays replicated
    activations.py  tp_saved_tensors: what one rank saves for backward (Korthikanti Table 2
                    adapted to the course GPT), measure_activations, table2_differences
    dtensor.py      the same with torch's DTensor: dtensor_plan, parallelize_dtensor, loss_parallel
    compare.py      the variants side by side: build, step, time_variants (tour, benchmark)
    cost.py         layer_flops, layer_comm_bytes, comm_compute_ratio: the per-layer arithmetic
    grads.py        all_reduce_sequence_partial_grads: SP's partial gradients in one all-reduce
    gqa.py          grouped-query attention with fewer KV heads than ranks (KV heads replicated)
    vocab.py        padded_vocab_size (Megatron's make-vocab-size-divisible-by), mask_padded_logits
    rng.py          RNGTracker: dropout masks that agree across the tp ranks, and ones that differ
    dropout.py      STREAMS: which dropout draws from which stream (track_dropout), and
                    one_process_dropout: the one-process GPT with the masks tp ranks draw
"""

from dlcourse.parallel.tensor.comm import (f, g, g_trap, gather_last_dim, gather_sequence,
                                           reduce_scatter_sequence, sequence_shard)
from dlcourse.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                             SequenceParallelLayerNorm, SequenceParallelPositions,
                                             VocabParallelEmbedding, shard, unshard)
from dlcourse.parallel.tensor.loss import vocab_parallel_cross_entropy, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.parallelize import (PLAN, TensorParallelGPT, check_tp,
                                                  full_parameters, parallelize)

__all__ = [
    "f", "g", "g_trap", "gather_last_dim", "gather_sequence", "reduce_scatter_sequence",
    "sequence_shard", "ColumnParallelLinear", "RowParallelLinear", "SequenceParallelLayerNorm",
    "SequenceParallelPositions", "VocabParallelEmbedding", "shard", "unshard",
    "vocab_parallel_cross_entropy", "vocab_parallel_lm_loss", "PLAN", "TensorParallelGPT",
    "check_tp", "full_parameters", "parallelize",
]
