"""What a GPU holds for a moment beyond what the step keeps (lesson 07's planner): the peak
of a step is `estimate.memory_per_gpu` (model state and the activations in flight, what
lessons 01 and 06 count) plus the largest of these transients, each from its source:

- the loss (`Workload.loss`). "in place": Megatron-LM's vocab-parallel cross-entropy
  (megatron/core/tensor_parallel/cross_entropy.py; megatron/model/gpt_model.py calls it on
  output.float()): the fp32 copy becomes the softmax it saves (4 bytes a logit, already
  counted as the activations' log-probabilities), its backward writes the gradient into that
  same storage, and the cast back to the bf16 logits' dtype adds 2: 6 bytes a logit at the
  peak. "fp32 eager":
  torchtitan's train.py (9dec370): cross_entropy(pred.flatten(0, 1).float(), ...) run by
  autograd, not compiled: nll_loss's backward allocates its fp32 gradient, log_softmax's
  backward another beside the saved log-probabilities: 12 bytes a logit. "fp32 eager, pred
  kept": torchtitan before that (395a526, its A100 table): the model returns
  output(h).float() and train.py holds that fp32 `pred` through backward: 16
  (tests/test_planner_transients.py measures all three with lesson 01's `measure_peak`);
- full recomputation: backward rebuilds one layer's activations at a time (the checkpoint,
  its input, is already counted), `activations.layer_saved_tensors` with recompute "none";
- ZeRO-3 (torch 2.13's FSDP2, distributed/fsdp/_fully_shard/_fsdp_param_group.py): in
  backward the layer running is unsharded in bf16, the one before it is prefetched
  (`_backward_prefetch`, one group ahead), the running layer's bf16 gradients accumulate,
  and the previous layer's fp32 reduce-scatter input is kept until this layer's reduce-scatter
  starts (`reduce_scatter_states`, one buffer by default): 2 + 2 + 2 + 4 = 10 bytes a
  parameter of one layer (tests/test_planner_transients.py reads FSDP2's own buffers in a
  2-rank run at a block's backward and finds exactly these). At the loss the last layer is unsharded (torchtitan does not reshard
  it after forward): 2 bytes a parameter of one layer. Without resharding after forward
  (`Layout.reshard` False, Llama 3's FSDP, which is Meta's own, not FSDP2) nothing is added:
  the gathered parameters are in the model state already, and Dubey et al. 2024 §3.3.2
  accumulate fp32 gradients over the pipeline's micro-batches before one reduce-scatter, a
  buffer whose lifetime the paper does not give (not modelled; the planner keeps ZeRO's
  sharded gradients).

The loss's moment and a layer's backward do not overlap, so the peak takes the larger. Not
modelled: the gradient temporaries of each op's backward (a few h-wide tensors), the ends'
(embedding, head) gathered parameters under ZeRO-3, and what the caching allocator holds
above what is allocated (`published.py` says what that leaves out of torchtitan's rows).
"""

from dlcourse.planner.activations import layer_activation_bytes

LOSS = ("in place", "fp32 eager", "fp32 eager, pred kept")
LOSS_PEAK_BYTES = {"in place": 6, "fp32 eager": 12, "fp32 eager, pred kept": 16}  # a logit
LOSS_KEPT_BYTES = 4  # the fp32 log-probabilities (softmax) saved for backward
ZERO3_BACKWARD_BYTES = 2 + 2 + 2 + 4  # unsharded, prefetched, bf16 grads, fp32 RS input
ZERO3_AT_LOSS_BYTES = 2  # the last layer, still unsharded


def logits(work, L):
    """Logits one GPU of the last stage holds for one micro-batch: its tokens x vocabulary / tp."""
    return work.seq_len / L.cp * L.micro_batch * work.model.vocab_size / L.tp


def loss_transient(work, L, one_layer_params):
    """Bytes beyond the kept log-probabilities at the loss's backward, on the last stage."""
    extra = (LOSS_PEAK_BYTES[work.loss] - LOSS_KEPT_BYTES) * logits(work, L)
    resharded = L.zero_stage == 3 and L.reshard
    return extra + (ZERO3_AT_LOSS_BYTES * one_layer_params if resharded else 0)


def layer_transient(work, L, one_layer_params):
    """Bytes beyond what is kept while one layer's backward runs."""
    rebuilt = 0.0
    if L.recompute in ("full", "op"):
        rebuilt = rebuilt_layer_bytes(work.model, work.seq_len // L.cp, L.micro_batch, tp=L.tp,
                                      sequence_parallel=L.sequence_parallel,
                                      attention=work.attention, mlp=work.mlp,
                                      kept=L.recompute)
    resharded = L.zero_stage == 3 and L.reshard
    in_flight = ZERO3_BACKWARD_BYTES * one_layer_params if resharded else 0
    return rebuilt + in_flight


def rebuilt_layer_bytes(spec, seq_len, micro_batch, kept="full", **settings):
    """Bytes recomputation rebuilds for one layer's backward: what the layer saves without
    recomputation less what the policy `kept` ("full": its input; "op": torchtitan's by-op
    rows) (`layer_activation_bytes`'s settings: tp, sequence_parallel, attention, mlp, bytes)."""
    def saved(recompute):
        return layer_activation_bytes(spec, seq_len, micro_batch, recompute=recompute, **settings)
    return max(saved("none") - saved(kept), 0.0)


def transient_bytes(work, L, one_layer_params, holds_loss):
    """The largest transient of a rank: a layer's backward, or (`holds_loss`) the loss's."""
    layer = layer_transient(work, L, one_layer_params)
    return max(layer, loss_transient(work, L, one_layer_params)) if holds_loss else layer

