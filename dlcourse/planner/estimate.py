"""What one layout costs: bytes per GPU, seconds per step, tokens per second, MFU and dollars
(lesson 07's planner). Every term is a formula an earlier lesson measured or a rate the GPU
has (`timing.py` for the time terms):

- model state: ZeRO's (2 + 2 + K)Ψ with K = 12, divided as the stage says (lesson 05, from
  `dlcourse.memory.model_state_bytes`), for the parameters of the busiest pipeline stage, the
  weight matrices and the vocabulary split over tp (lesson 04), norms replicated; ZeRO-3
  without resharding after forward also holds its stage's gathered bf16 parameters;
- activations: each tensor one layer of this model saves (`activations.py`: Korthikanti et
  al. 2022, Table 2 for GPT-3's layer; Llama's RMSNorm, SwiGLU and grouped-query K/V as they
  are; lesson 04: tp, sequence parallelism, recomputation), without the s x s scores when the
  attention kernel is fused, times the
  micro-batches a stage holds at once, counted by lesson 06's `in_flight_peak` over its own
  schedules (1F1B's first stage holds p; interleaving holds p (1 + (p - 1)/(p v)): more, not
  less), plus the fp32 log-probabilities of the loss on the last stage, split over tp;
- the peak (`peak_memory`, what `Estimate.memory` holds and `fits` checks): the above plus
  the largest transient (`transients.py`): the loss's backward, the layer recomputed in
  backward, ZeRO-3's unsharded layers and gradients in flight;
- time: the matmuls at the GPU's sustained matmul rate (MAMF x its fitted in-step share,
  roofline for thin ones), the element-wise kernels and the loss's at its memory bandwidth,
  stretched by the pipeline bubble (lesson 06's
  `bubble_formula`: the idle share of the step); plus what communication is not hidden (tp's
  all-reduces, the pipeline's fill and drain sends, cp's gathers of keys and values, dp / ZeRO's
  reductions and gathers) and Adam's step at memory bandwidth.

Context parallelism (lesson 08) gives each of cp ranks 1/cp of every sequence: its activations,
its share of the matmuls and of every other axis's messages shrink by cp; its gradients are
reduced, and ZeRO shards, over dp x cp (`Layout.replicas`). Attention still sees the whole
sequence: each query's FLOPs count all s keys.

A mixture of experts (lesson 09) is estimated by `moe_estimate.py` from these terms and
`moe_cost.py`'s. Not modelled: offload, kernel-level overlap of tp
communication and kernel launch gaps. What a real GPU holds beyond the counted peak (the CUDA
context, NCCL's buffers, the allocator's reserve) is `margin.py`'s: `Estimate.fits` keeps it.
"""

import functools
import math
from dataclasses import dataclass

from dlcourse.memory.accounting import model_state_bytes
from dlcourse.memory.calculator import spec_params
from dlcourse.parallel.pipeline.measure import bubble_formula, in_flight_peak
from dlcourse.parallel.pipeline.schedules import Action, interleaved_1f1b, one_f_one_b

from dlcourse.planner import margin
from dlcourse.planner.transients import transient_bytes
from dlcourse.planner.timing import (BYTES, cp_time, dp_time, elementwise_bytes,
                                     hardware_flops_per_token, layer_activations, loss_time,
                                     model_flops_per_token, optimizer_time, pp_time,
                                     shape_efficiency, tp_time)



@dataclass
class Estimate:
    layout: object
    memory: float  # bytes on the busiest GPU at its peak (`peak_memory`)
    fits: bool
    step_time: float  # seconds per optimizer step
    compute_time: float  # ... of which matmuls and element-wise kernels, bubble included
    bubble: float  # idle share of the pipeline's step (lesson 06's bubble_formula)
    tp_time: float  # exposed tensor-parallel all-reduces
    cp_time: float  # exposed context-parallel gathers of K and V (and reduce-scatters of dK, dV)
    pp_time: float  # sends between pipeline stages on the critical path (fill and drain)
    dp_time: float  # exposed data-parallel / ZeRO communication
    optimizer_time: float  # Adam's read and write of its state at memory bandwidth
    tokens_per_s: float
    mfu: float  # model FLOPs (6Ψ + 12Lhs per token) / (time x GPUs x peak)
    dollars_per_m_tokens: float
    ep_time: float = 0.0  # expert parallel's all-to-alls (an MoE, `moe_estimate.py`)
    goodput: float = 1.0  # time kept despite failures, in tokens/s and $ already (`failures.py`)


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
    last. With light ends (Llama 3), the most any rank holds (`rank_params`)."""
    if layout.light_ends:
        return max(rank_params(spec, layout, r) for r in _candidate_ranks(layout))
    split, replicated = layer_params(spec)
    layers = math.ceil(spec.n_layers / layout.pp) * (split / layout.tp + replicated)
    ends = _ends(spec, layout)
    return layers + (sum(ends) if layout.pp == 1 else max(ends))


def rank_params(spec, layout, rank):
    """Parameters on one GPU of pipeline rank `rank`: the layers of its chunks (`chunk_layers`),
    the embedding on rank 0, the final norm and head on rank p - 1."""
    split, replicated = layer_params(spec)
    chunks = chunk_layers(spec.n_layers, layout.pp * layout.interleave, layout.light_ends)
    layers = sum(chunks[rank::layout.pp]) * (split / layout.tp + replicated)
    first, last = _ends(spec, layout)
    return layers + (first if rank == 0 else 0) + (last if rank == layout.pp - 1 else 0)


def chunk_layers(n_layers, chunks, light_ends=False):
    """Layers in each of the pipeline's `chunks` (virtual) stages, in order: ceil(L / chunks)
    each (the busiest). With light ends, Dubey et al. 2024 §3.3.2 (Llama 3): L + 2 layer
    slots split as evenly as they go (the spare ones to the chunks after the first), then the
    first and the last chunk one layer lighter; at one layer a chunk the first holds only the
    embedding and the last only the head and the loss."""
    if not light_ends:
        return [math.ceil(n_layers / chunks)] * chunks
    base, spare = divmod(n_layers + 2, chunks)
    slots = [base + (1 <= c <= spare) for c in range(chunks)]
    return [n - (c in (0, chunks - 1)) for c, n in enumerate(slots)]


def _ends(spec, layout):
    """(first stage's, last stage's) parameters beyond its layers, on one GPU."""
    head = _head(spec) or (spec.vocab_size * spec.hidden if layout.pp > 1 else 0)
    final_norm = 2 * spec.hidden if spec.bias else spec.hidden  # replicated on every tp rank
    positions = spec.seq_len * spec.hidden if spec.learned_positions else 0  # not split (lesson 04)
    return spec.vocab_size * spec.hidden / layout.tp + positions, head / layout.tp + final_norm


def _state_bytes(n_params, L):
    state = model_state_bytes(n_params, dp=L.replicas, zero_stage=L.zero_stage).total
    if L.zero_stage == 3 and not L.reshard:  # gathered at forward, kept until backward
        state += BYTES * n_params * (1 - 1 / L.replicas)
    return state


def memory_per_gpu(work, layout):
    """Bytes on the busiest GPU: its stage's model state, and its activations in flight. With
    light ends the ranks differ in both, so each candidate rank adds its own."""
    spec, L = work.model, layout
    if L.light_ends:
        return max(_state_bytes(rank_params(spec, L, r), L) + activations_in_flight(work, L, {r})
                   for r in _candidate_ranks(L))
    return _state_bytes(stage_params(spec, L), L) + activations_in_flight(work, L)


def peak_memory(work, layout):
    """Bytes on the busiest GPU at its peak: each candidate rank's model state and
    activations in flight (`memory_per_gpu`) plus its largest transient (`transients.py`; the
    loss's on the last rank only)."""
    spec, L = work.model, layout
    split, replicated = layer_params(spec)
    one_layer = split / L.tp + replicated
    peaks = []
    for r in _candidate_ranks(L):
        params = rank_params(spec, L, r) if L.light_ends else stage_params(spec, L)
        kept = _state_bytes(params, L) + activations_in_flight(work, L, {r})
        peaks.append(kept + transient_bytes(work, L, one_layer, holds_loss=r == L.pp - 1))
    return max(peaks)


def activations_in_flight(work, L, ranks=None):
    """The most activation bytes a pipeline rank holds at once: lesson 06's `in_flight_peak`
    over the rank's 1F1B (v = 1) or interleaved 1F1B action list, each (virtual) stage's
    micro-batch costing its layers' activations (`chunk_layers`; the last one adds the loss's
    fp32 log-probabilities). Ranks 0 (most in flight), 1 (one fewer, but a whole stage when
    the ends are light) and p - 1 (the loss) are the candidates for the busiest."""
    spec = work.model
    one_layer = layer_activations(work, L)
    log_probs = 4 * work.seq_len / L.cp * L.micro_batch * spec.vocab_size / L.tp
    chunks = L.pp * L.interleave
    layers = chunk_layers(spec.n_layers, chunks, L.light_ends)
    stage_bytes = {s: layers[s] * one_layer + (log_probs if s == chunks - 1 else 0)
                   for s in range(chunks)}
    return max(in_flight_peak(schedule_actions(r, L.pp, L.micro_batches, L.interleave),
                              stage_bytes) for r in ranks or _candidate_ranks(L))


def _candidate_ranks(L):
    return {0, min(1, L.pp - 1), L.pp - 1}


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


def estimate(work, layout, cluster):
    """An `Estimate` of `layout` training `work` on `cluster`."""
    spec, L, gpu = work.model, layout, cluster.gpu
    if hasattr(spec, "n_experts"):  # a mixture of experts (lesson 09) adds its own terms
        raise ValueError(f"{spec.name} is a mixture of experts: moe_estimate.moe_estimate adds "
                         "its terms to these (rank.estimate_any picks the right one)")
    memory = peak_memory(work, L)
    n_params = stage_params(spec, L)
    tokens = work.batch_tokens / (L.replicas * L.pp)  # per GPU-row of the pipeline, per step
    flops = hardware_flops_per_token(spec, work.seq_len, L.recompute, work.attention)
    shape = shape_efficiency(spec, L.micro_batch * work.seq_len // L.cp, L.tp, gpu)
    matmuls = flops * tokens / L.tp / (gpu.peak_flops * gpu.matmul_efficiency * shape)
    elementwise = (elementwise_bytes(work, L) * spec.n_layers / L.pp * L.micro_batches
                   / gpu.hbm_bw)
    bubble = bubble_share(L)
    loss = loss_time(work, L, gpu)  # on the last stage, which the others wait behind
    compute = (matmuls + elementwise + loss) / (1 - bubble)
    tp, pp, cp = tp_time(work, L, cluster), pp_time(work, L, cluster), cp_time(work, L, cluster)
    dp, hideable = dp_time(work, L, cluster, n_params)
    exposed_dp = max(0.0, dp - hideable * (matmuls + elementwise))
    optimizer = optimizer_time(n_params, L, gpu)
    step = compute + tp + cp + pp + exposed_dp + optimizer
    model_flops = model_flops_per_token(spec, work.seq_len) * work.batch_tokens
    return Estimate(
        L, memory, margin.fits(gpu, L, memory), step, compute, bubble, tp, cp, pp,
        exposed_dp, optimizer, work.batch_tokens / step,
        model_flops / (step * cluster.n_gpus * gpu.peak_flops),
        cluster.dollars_per_hour() * step / 3600 / (work.batch_tokens / 1e6))


def bubble_share(L):
    """The idle share of the step, lesson 06's definition and formula (`bubble_formula`):
    (p - 1)/(m + p - 1) for 1F1B, (p - 1)/(v m + p - 1) interleaved; 0 without a pipeline."""
    if L.pp == 1:
        return 0.0
    if L.interleave == 1:
        return bubble_formula("1F1B", L.pp, L.micro_batches)
    return bubble_formula("interleaved 1F1B", L.pp, L.micro_batches, L.interleave)


def _embedding(spec):
    return spec.vocab_size * spec.hidden + (spec.seq_len * spec.hidden
                                            if spec.learned_positions else 0)


def _head(spec):
    return 0 if spec.tied else spec.vocab_size * spec.hidden
