"""How long one layout's step takes, term by term (lesson 07's planner; `estimate.py` adds
them up). Every term is a count of FLOPs or bytes over a rate the GPU or link has:

    matmuls       hardware FLOPs / (peak x MAMF), each matmul held to the roofline (small ones
                  are memory-bound: Williams et al. 2009)
    element-wise  the activations' bytes written, read and their gradients written, over HBM
                  bandwidth (these kernels do no matmul: Ivanov et al. 2021, "Data Movement Is
                  All You Need", find them memory-bound)
    loss          the cross-entropy's kernels over the logits (fp32 softmax, its gradient, the
                  casts), bytes a logit over HBM bandwidth, on the last stage (`loss_time`)
    optimizer     Adam reads and writes its fp32 state, reads the gradient and writes the bf16
                  parameter: 28 bytes per parameter this GPU updates, over HBM bandwidth
    tp, cp, pp, dp  lesson 02's alpha-beta ring costs of the collectives and sends each axis needs
"""

from dlcourse.collectives.cost import predict_time
from dlcourse.memory.calculator import spec_params
from dlcourse.planner.activations import layer_activation_bytes, op_recomputed_linears
from dlcourse.planner.transients import logits

BYTES = 2  # bf16 activations, parameters and gradients (mixed precision)
ADAM_BYTES = 2 * 12 + 2 + 2  # read + write fp32 master, m, v; read bf16 grad; write bf16 param


def model_flops_per_token(spec, seq_len):
    """6Ψ + 12 L h s: forward and backward FLOPs of one token, attention scores included (the
    PaLM convention, no causal halving)."""
    return 6 * spec_params(spec) + 12 * spec.n_layers * spec.hidden * seq_len


def hardware_flops_per_token(spec, seq_len, recompute, attention="eager"):
    """The model's FLOPs plus what is computed twice: full recomputation, a whole forward (a
    third); selective (eager), the attention's forward, QK^T and PV (4 L h s); the fused
    kernel's backward recomputes QK^T (2 L h s; Dao 2023, FlashAttention-2, Algorithm 2);
    torchtitan's by-op policy ("op"), every other weight matmul of each layer
    (`activations.op_recomputed_linears`: 2 x in x out a token each; torchtitan's
    early_stop=False runs even the last one)."""
    lhs = spec.n_layers * spec.hidden * seq_len
    extra = {"none": 0, "selective": 4 * lhs,
             "op": spec.n_layers * sum(2 * k * n for _, k, n, _ in op_recomputed_linears(spec)),
             "full": model_flops_per_token(spec, seq_len) / 3}[recompute]
    if attention == "fused" and recompute != "selective":
        extra += 2 * lhs
    return model_flops_per_token(spec, seq_len) + extra


def layer_matmuls(spec, tokens, tp):
    """(M, K, N) of one layer's weight matmuls on one tp rank, `tokens` rows: QKV, the
    projection, the MLP's up (and gate) and down (Megatron's column / row split)."""
    h, head = spec.hidden, spec.hidden // spec.n_heads
    up = spec.ffn * (2 if spec.gated_mlp else 1)
    return [(tokens, h, (h + 2 * spec.kv_heads * head) // tp), (tokens, h // tp, h),
            (tokens, h, up // tp), (tokens, spec.ffn // tp, h)]


def shape_efficiency(spec, tokens, tp, gpu):
    """The share of the matmul ceiling (peak x MAMF) a layer's matmuls keep on one GPU: each
    takes max(FLOPs / ceiling, bytes / HBM bandwidth), the roofline, with bf16 operands and
    result (2 (MK + KN + MN) bytes). 1.0 for large matmuls; less when tp cuts them thin."""
    return roofline_share(layer_matmuls(spec, tokens, tp), gpu)


def roofline_share(matmuls, gpu):
    """sum of FLOPs / ceiling over sum of max(FLOPs / ceiling, bytes / HBM bandwidth) for
    matmuls [(M, K, N)] with bf16 operands and result: the share of the ceiling they keep."""
    ceiling = gpu.peak_flops * gpu.matmul_efficiency
    ideal = held = 0.0
    for M, K, N in matmuls:
        compute = 2 * M * K * N / ceiling
        ideal += compute
        held += max(compute, BYTES * (M * K + K * N + M * N) / gpu.hbm_bw)
    return ideal / held


def elementwise_bytes(work, L):
    """Bytes the element-wise kernels (norms, activations, dropout, softmax, residuals) move
    for one micro-batch through one layer on one GPU: every activation Korthikanti et al.
    count is written in the forward, read in the backward, and its gradient written: 3 times
    the stored bytes without recomputation (4 with full recomputation's second forward)."""
    stored = layer_activations(work, L, recompute="none")
    return stored * (4 if L.recompute in ("full", "op") else 3)  # "op" reruns the cheap ops


# Bytes the loss's kernels move per logit, forward and backward, each kernel reading its inputs
# and writing its output once (`Workload.loss`):
# - "in place", Megatron-LM's vocab-parallel cross-entropy (megatron/core/tensor_parallel/
#   cross_entropy.py): .float() (read 2, write 4), max (4), the in-place subtraction (4 + 4),
#   exp (4 + 4), its sum (4), the in-place division into the softmax it saves (4 + 4): 38;
#   backward: the gradient scaled in place (4 + 4) and cast back to bf16 (4 + 2): 14;
# - "fp32 eager", torchtitan's cross_entropy(pred.float()) under autograd: .float() (2 + 4),
#   log_softmax (4 + 4); backward: nll_loss's zeroed fp32 gradient (4), log_softmax's backward
#   (4 + 4 + 4), the cast back (4 + 2): 36, whether or not the fp32 `pred` is kept.
LOSS_TRAFFIC_BYTES = {"in place": 52, "fp32 eager": 36, "fp32 eager, pred kept": 36}


def loss_time(work, L, gpu):
    """Seconds the loss's element-wise kernels take in one step on the last stage: every
    micro-batch's logits (tokens x vocabulary / tp) x LOSS_TRAFFIC_BYTES over HBM bandwidth.
    Its share grows as the vocabulary does beside the width: 6% of a 1.7B GPT's step at
    vocabulary 131,072 and hidden 2,048 on an H100, under 1% for a 70B."""
    return LOSS_TRAFFIC_BYTES[work.loss] * logits(work, L) * L.micro_batches / gpu.hbm_bw


def layer_activations(work, L, recompute=None):
    """Bytes one layer saves for backward for one micro-batch on one tp rank, tensor by tensor
    for the model's own layer (`dlcourse.planner.activations`: dropout or not, GELU or SwiGLU
    of width ffn, K and V at kv_heads, LayerNorm or RMSNorm; bf16 values, 1-byte dropout
    masks). For GPT-3's layer it is Korthikanti et al. 2022, Table 2 (plus the norms' fp32
    statistics). Eager attention stores the s x s scores (and, with dropout, their mask and the
    dropout output); the fused kernel (FlashAttention, SDPA) stores none of them, only one
    fp32 logsumexp per head and query beside Q, K, V and its output."""
    return layer_activation_bytes(work.model, work.seq_len // L.cp, L.micro_batch, tp=L.tp,
                                  sequence_parallel=L.sequence_parallel,
                                  recompute=recompute or L.recompute, attention=work.attention,
                                  mlp=work.mlp, bytes_per_value=BYTES)


def ring_time(op, nbytes, ranks, alpha, bandwidth):
    """Seconds of a ring `op` ("all_reduce", "all_gather", "reduce_scatter") of `nbytes` over
    `ranks` GPUs: lesson 02's alpha-beta model (`dlcourse.collectives.predict_time`)."""
    return 0.0 if ranks == 1 else predict_time(f"ring {op}", nbytes, ranks, alpha, 1 / bandwidth)


def tp_time(work, L, cluster):
    """4 all-reduces of (micro-batch x s x h) per layer and micro-batch (2 forward, 2 backward;
    with sequence parallelism the same bytes as all-gathers + reduce-scatters), 6 with full
    recomputation; on the critical path."""
    count = 6 if L.recompute in ("full", "op") else 4  # "op" reruns the forward's two
    nbytes = L.micro_batch * work.seq_len // L.cp * work.model.hidden * BYTES
    alpha, bw = cluster.link(L.tp)
    layers = work.model.n_layers / L.pp
    return L.micro_batches * layers * count * ring_time("all_reduce", nbytes, L.tp, alpha, bw)


def cp_time(work, L, cluster):
    """Context parallel as Llama 3 runs it (Dubey et al. 2024, §3.3.2; lesson 08's all-gather
    variant): per layer and micro-batch, K and V (kv_heads x head_dim wide, split over tp) are
    all-gathered over the cp ranks before attention, in forward and again in backward (the
    planner keeps no gathered copy), and their gradients reduce-scattered back; one gather more
    with full recomputation. Llama 3 leaves these on the critical path (small beside Q thanks to
    grouped-query attention), and so does the planner. cp ranks stand tp apart."""
    if L.cp == 1:
        return 0.0
    spec = work.model
    kv = 2 * L.micro_batch * work.seq_len * spec.kv_heads * (spec.hidden // spec.n_heads)
    nbytes = kv / L.tp * BYTES  # the whole sequence's K and V, as gathered on one rank
    alpha, bw = cluster.link(L.tp * L.cp)
    gathers = 3 if L.recompute in ("full", "op") else 2
    per_layer = (gathers * ring_time("all_gather", nbytes, L.cp, alpha, bw)
                 + ring_time("reduce_scatter", nbytes, L.cp, alpha, bw))
    return L.micro_batches * spec.n_layers / L.pp * per_layer


def pp_time(work, L, cluster):
    """The sends between stages that nobody waits behind, and those someone does. In 1F1B a
    steady-state send overlaps the sender's next F or B; what the step waits for is the first
    micro-batch's way down (rank r starts r sends after rank 0) and the last one's gradient
    way back up: 2 (p - 1) sends on the critical path, each one micro-batch's activation
    (1/tp of it per rank with sequence parallelism). Interleaving cuts the same p - 1 hops."""
    if L.pp == 1:
        return 0.0
    nbytes = L.micro_batch * work.seq_len // L.cp * work.model.hidden * BYTES
    nbytes /= L.tp if L.sequence_parallel else 1
    alpha, bw = cluster.link(L.n_gpus)  # pipeline neighbours are tp x cp x dp ranks apart
    return 2 * (L.pp - 1) * (alpha + nbytes / bw)


def dp_time(work, L, cluster, n_params):
    """(seconds, the share of the step's compute it can hide under) of the dp / ZeRO traffic,
    `n_params` parameters on this GPU's stage:
    - stages 0 and 1: the gradients all-reduced once (reduce-scatter + all-gather, 2Ψ), under
      the last micro-batch's backward;
    - stage 2: the gradients are sharded, so each micro-batch's are reduce-scattered at its
      backward (m times), under every backward; the updated parameters all-gathered once;
    - stage 3: every micro-batch gathers the parameters for forward and again for backward
      (once, if they are kept from forward to backward: `reshard=False`, FSDP's
      reshard_after_forward) and reduce-scatters the gradients; prefetched under all compute."""
    nbytes, replicas = n_params * BYTES, L.replicas  # dp x cp ranks hold the same weights
    alpha, bw = cluster.link(L.tp * replicas)  # they stand tp apart
    gather, scatter = (ring_time(op, nbytes, replicas, alpha, bw)
                       for op in ("all_gather", "reduce_scatter"))
    if L.zero_stage == 3:
        gathers = 2 if L.reshard else 1
        return L.micro_batches * (gathers * gather + scatter), 1.0
    backward = 2 / 3  # of a micro-batch's compute (backward = 2 forwards)
    if L.zero_stage == 2:
        return L.micro_batches * scatter + gather, backward
    return ring_time("all_reduce", nbytes, replicas, alpha, bw), backward / L.micro_batches


def optimizer_time(n_params, L, gpu):
    """Adam's step: ADAM_BYTES per parameter this GPU updates (its 1/dp share under ZeRO)."""
    updated = n_params / (L.replicas if L.zero_stage else 1)
    return ADAM_BYTES * updated / gpu.hbm_bw
