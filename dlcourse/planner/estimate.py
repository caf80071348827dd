"""What one layout costs: bytes per GPU, seconds per step, tokens per second, MFU and dollars
(lesson 07's planner). Every term is a formula an earlier lesson measured:

- model state: ZeRO's (2 + 2 + K)Ψ with K = 12, divided as the stage says (lesson 05, from
  `dlcourse.memory.model_state_bytes`), for the parameters of the busiest pipeline stage, the
  weight matrices and the vocabulary split over tp (lesson 04), norms replicated;
- activations: Korthikanti et al. 2022, Table 2 (`dlcourse.memory.activation_bytes`, lesson 04:
  tp, sequence parallelism, recomputation), times the micro-batches a stage holds at once,
  counted by lesson 06's `in_flight_peak` over its own schedules (1F1B's first stage holds p;
  interleaving holds p (1 + (p - 1)/(p v)): more, not less), plus the fp32 log-probabilities
  of the loss on the last stage, split over tp;
- time: compute at `efficiency` of the GPU's peak, 6Ψ + 12Lhs FLOPs per token (the PaLM
  convention, attention included) plus what recomputation adds; stretched by the pipeline
  bubble (p - 1)/(v m); plus the communication that is not hidden, with lesson 02's alpha-beta
  ring costs: tp's all-reduces (4 per layer and micro-batch, 6 with full recomputation) on the
  critical path, pipeline sends between stages, and the dp/ZeRO gradient reduction (ZeRO-3 also
  gathers parameters for every micro-batch), minus what overlaps with the last backward.

Not modelled: offload, context parallelism, expert parallelism, kernel-level overlap of tp
communication, and the memory the framework itself takes (left as `HEADROOM`).
"""

import functools
import math
from dataclasses import dataclass

from dlcourse.collectives.cost import predict_time
from dlcourse.memory.accounting import activation_bytes, model_state_bytes
from dlcourse.memory.calculator import spec_params
from dlcourse.parallel.pipeline.measure import in_flight_peak
from dlcourse.parallel.pipeline.schedules import Action, interleaved_1f1b, one_f_one_b

EFFICIENCY = 0.6  # fraction of the datasheet peak that a training step's matmuls sustain
HEADROOM = 0.1  # fraction of device memory left for the CUDA context, buffers, fragmentation
BYTES = 2  # bf16 activations, parameters and gradients (mixed precision)


@dataclass
class Estimate:
    layout: object
    memory: float  # bytes on the busiest GPU
    fits: bool
    step_time: float  # seconds per optimizer step
    compute_time: float  # ... of which computation, bubble included
    bubble: float  # (p - 1)/(v m): idle fraction added to the compute
    tp_time: float  # exposed tensor-parallel all-reduces
    pp_time: float  # sends between pipeline stages
    dp_time: float  # exposed data-parallel / ZeRO communication
    tokens_per_s: float
    mfu: float  # model FLOPs (6Ψ + 12Lhs per token) / (time x GPUs x peak)
    dollars_per_m_tokens: float


def layer_params(spec):
    """(split over tp, replicated) parameters of one transformer layer of a `ModelSpec`."""
    h = spec.hidden
    norm = 2 * h if spec.bias else h
    total = (spec_params(spec) - _embedding(spec) - _head(spec) - norm) // spec.n_layers
    replicated = 2 * norm + (2 * h if spec.bias else 0)  # norms; biases after row-parallel
    return total - replicated, replicated


def stage_params(spec, layout):
    """Parameters on one GPU of the busiest pipeline stage: ceil(L/p) layers, plus the embedding
    on the first stage (the vocabulary split over tp, the position table whole, as lesson 04 and
    Megatron-LM keep it) or the final norm and head (untied, or a tied copy when p > 1) on the
    last."""
    split, replicated = layer_params(spec)
    layers = math.ceil(spec.n_layers / layout.pp) * (split / layout.tp + replicated)
    head = _head(spec) or (spec.vocab_size * spec.hidden if layout.pp > 1 else 0)
    final_norm = 2 * spec.hidden if spec.bias else spec.hidden  # replicated on every tp rank
    positions = spec.seq_len * spec.hidden if spec.learned_positions else 0  # not split (lesson 04)
    ends = [spec.vocab_size * spec.hidden / layout.tp + positions, head / layout.tp + final_norm]
    return layers + (sum(ends) if layout.pp == 1 else max(ends))


def memory_per_gpu(work, layout):
    """Bytes on the busiest GPU: its stage's model state, and its activations in flight."""
    spec, L = work.model, layout
    state = model_state_bytes(stage_params(spec, L), dp=L.dp, zero_stage=L.zero_stage).total
    return state + activations_in_flight(work, L)


def activations_in_flight(work, L):
    """The most activation bytes a pipeline rank holds at once: lesson 06's `in_flight_peak`
    over the rank's 1F1B (v = 1) or interleaved 1F1B action list, each (virtual) stage's
    micro-batch costing its layers' activations (an interleaved chunk holds L/(p v) layers;
    the last one adds the loss's fp32 log-probabilities). Ranks 0 (most in flight) and p - 1
    (the loss) are the candidates for the busiest."""
    spec = work.model
    one_layer = activation_bytes(work.seq_len, L.micro_batch, spec.hidden, spec.n_heads, 1,
                                 L.tp, L.sequence_parallel, L.recompute, bytes_per_value=BYTES)
    log_probs = 4 * work.seq_len * L.micro_batch * spec.vocab_size / L.tp
    chunks = L.pp * L.interleave
    per_chunk = math.ceil(spec.n_layers / chunks) * one_layer
    stage_bytes = {s: per_chunk + (log_probs if s == chunks - 1 else 0) for s in range(chunks)}
    return max(in_flight_peak(schedule_actions(r, L.pp, L.micro_batches, L.interleave),
                              stage_bytes) for r in {0, L.pp - 1})


@functools.lru_cache(maxsize=4096)
def schedule_actions(rank, pp, micro_batches, interleave):
    """Lesson 06's action list of `rank` (`dlcourse.parallel.pipeline.schedules`): 1F1B, or
    interleaved 1F1B with v = `interleave` chunks; one forward and backward when pp = 1 (each
    micro-batch's activations are freed by its backward before the next one starts)."""
    if pp == 1:
        return (Action(0, "F", 0), Action(0, "B", 0))
    if interleave == 1:
        return tuple(one_f_one_b(rank, pp, micro_batches))
    return tuple(interleaved_1f1b(rank, pp, micro_batches, interleave))


def in_flight_micro_batches(pp, micro_batches, interleave=1):
    """Micro-batches of a whole stage's layers the first rank holds at once: p for 1F1B once
    m >= p; (p - 1 + v p) chunks of 1/v of a stage, that is p (1 + (p - 1)/(p v)), interleaved
    (Narayanan et al. 2021; Korthikanti et al. 2022 §4.2.3)."""
    return in_flight_peak(schedule_actions(0, pp, micro_batches, interleave)) / interleave


def model_flops_per_token(spec, seq_len):
    """6Ψ + 12 L h s: forward and backward FLOPs of one token, attention scores included."""
    return 6 * spec_params(spec) + 12 * spec.n_layers * spec.hidden * seq_len


def hardware_flops_per_token(spec, seq_len, recompute):
    """The model's FLOPs plus what recomputation repeats: full, a whole forward (a third);
    selective, the attention scores' forward (4 L h s)."""
    extra = {"none": 0, "selective": 4 * spec.n_layers * spec.hidden * seq_len,
             "full": model_flops_per_token(spec, seq_len) / 3}[recompute]
    return model_flops_per_token(spec, seq_len) + extra


def ring_time(op, nbytes, ranks, alpha, bandwidth):
    """Seconds of a ring `op` ("all_reduce", "all_gather", "reduce_scatter") of `nbytes` over
    `ranks` GPUs: lesson 02's alpha-beta model (`dlcourse.collectives.predict_time`)."""
    return 0.0 if ranks == 1 else predict_time(f"ring {op}", nbytes, ranks, alpha, 1 / bandwidth)


def estimate(work, layout, cluster, efficiency=EFFICIENCY, headroom=HEADROOM):
    """An `Estimate` of `layout` training `work` on `cluster`."""
    spec, L, gpu = work.model, layout, cluster.gpu
    memory = memory_per_gpu(work, L)
    flops = hardware_flops_per_token(spec, work.seq_len, L.recompute) * work.batch_tokens
    bubble = (L.pp - 1) / (L.interleave * L.micro_batches)
    compute = flops / (cluster.n_gpus * gpu.peak_flops * efficiency) * (1 + bubble)
    tp, pp, dp = _tp_time(work, L, cluster), _pp_time(work, L, cluster), _dp_time(work, L,
                                                                                  cluster)
    # ZeRO-3 prefetches its gathers under the whole step's compute; the gradient reduction of
    # stages 0-2 can only hide under the last micro-batch's backward (2/3 of its compute).
    hidden = compute if L.zero_stage == 3 else compute / (1 + bubble) / L.micro_batches * 2 / 3
    exposed_dp = max(0.0, dp - hidden)
    step = compute + tp + pp + exposed_dp
    model_flops = model_flops_per_token(spec, work.seq_len) * work.batch_tokens
    return Estimate(
        L, memory, memory <= (1 - headroom) * gpu.memory, step, compute, bubble, tp, pp,
        exposed_dp, work.batch_tokens / step, model_flops / (step * cluster.n_gpus *
                                                             gpu.peak_flops),
        cluster.dollars_per_hour() * step / 3600 / (work.batch_tokens / 1e6))


def _tp_time(work, L, cluster):
    """4 all-reduces of (micro-batch x s x h) per layer and micro-batch (2 forward, 2 backward;
    with sequence parallelism the same bytes as all-gathers + reduce-scatters), 6 with full
    recomputation; on the critical path."""
    count = 6 if L.recompute == "full" else 4
    nbytes = L.micro_batch * work.seq_len * work.model.hidden * BYTES
    alpha, bw = cluster.link(L.tp)
    layers = math.ceil(work.model.n_layers / L.pp)
    return L.micro_batches * layers * count * ring_time("all_reduce", nbytes, L.tp, alpha, bw)


def _pp_time(work, L, cluster):
    """Each micro-batch's activation sent forward and its gradient sent back, per chunk; with
    sequence parallelism each tp rank sends its 1/tp slice."""
    if L.pp == 1:
        return 0.0
    nbytes = L.micro_batch * work.seq_len * work.model.hidden * BYTES
    nbytes /= L.tp if L.sequence_parallel else 1
    alpha, bw = cluster.link(L.tp * L.dp * L.pp)  # pipeline neighbours are tp x dp ranks apart
    return L.micro_batches * L.interleave * 2 * (alpha + nbytes / bw)


def _dp_time(work, L, cluster):
    """Gradients reduced over dp once a step (an all-reduce = reduce-scatter + all-gather, 2Ψ);
    ZeRO-3 gathers parameters forward and backward and reduce-scatters for every micro-batch."""
    nbytes = stage_params(work.model, L) * BYTES
    alpha, bw = cluster.link(L.tp * L.dp)  # dp ranks stand tp apart
    if L.zero_stage == 3:  # two all-gathers and a reduce-scatter, every micro-batch
        return L.micro_batches * (2 * ring_time("all_gather", nbytes, L.dp, alpha, bw)
                                  + ring_time("reduce_scatter", nbytes, L.dp, alpha, bw))
    return ring_time("all_reduce", nbytes, L.dp, alpha, bw)


def _embedding(spec):
    return spec.vocab_size * spec.hidden + (spec.seq_len * spec.hidden
                                            if spec.learned_positions else 0)


def _head(spec):
    return 0 if spec.tied else spec.vocab_size * spec.hidden
