"""An `Estimate` of a mixture of experts (lesson 09; issue 34): the dense planner's terms for
what is dense (attention, norms, routers, shared experts, dense layers), `moe_cost.py`'s for the
experts, added up as `estimate.py` adds a dense model's.

Simplifications, each an upper bound or an approximation said here:
- activations: every layer is counted as the larger of an MoE layer and a dense one
  (`moe_activations.saved_bytes`, less what the `Recipe` recomputes or caches in FP8), each
  pipeline rank's micro-batches in flight walked on lesson 06's schedule (DualPipe: its
  README's p + 1), the loss's fp32 log-probabilities on the last chunk;
- the largest transient is the dense planner's (`transients.py`) for a dense layer as wide as
  the busiest rank's routed rows make an MoE layer (`routed_width`), with the biggest layer's
  parameters;
- recomputation: none or full for the layout (the selective and by-op policies are counted
  for dense layers; `layouts.problems` refuses them for an MoE), and a `Recipe`'s
  Megatron-Core modules ("layernorm", "moe_act", "mla_up_proj"), counted in memory and not
  timed (a few % of the FLOPs);
- the expert-data-parallel traffic and Adam's step over the experts are the dense terms over
  `RankGrid.expert_data_parallel` ranks that span the stage's dp x cp x tp (so the network
  once they leave a node);
- the element-wise kernels' memory traffic is the dense planner's convention on the MoE
  layer's stored tensors (`elementwise_seconds`);
- the all-to-alls are on the critical path unless a `Recipe` overlaps them (DualPipe,
  Megatron-Core's EP overlap): then only what outlasts the step's compute is exposed, an
  optimistic bound (a real overlap pairs one micro-batch's all-to-all with another's compute,
  chunk by chunk).
"""

from dataclasses import replace

from dlcourse.planner import margin
from dlcourse.parallel.pipeline.measure import in_flight_peak
from dlcourse.planner.estimate import Estimate, bubble_share, schedule_actions
from dlcourse.planner.moe_activations import saved_bytes
from dlcourse.planner.moe_cost import (Recipe, active_flops_per_token, all_to_all_seconds,
                                       chunk_ranges, deepep_seconds, expert_seconds,
                                       rank_state_bytes, rank_tokens, routed_rows,
                                       score_flops_per_token, stage_layers, stage_params)
from dlcourse.planner.moe_spec import active_params, mlp_params
from dlcourse.planner.timing import (cp_time, dp_time, optimizer_time, pp_time, shape_efficiency,
                                     tp_time)
from dlcourse.planner.transients import transient_bytes


def layer_bytes(work, L, recipe=Recipe()):
    """Bytes the larger of an MoE and a dense layer saves for one micro-batch on one GPU
    (`moe_activations.saved_bytes`); with full recomputation only its input."""
    return saved_bytes(work, L, recipe)


def rank_activations(work, L, rank, recipe=Recipe()):
    """The most activation bytes pipeline rank `rank` holds at once: lesson 06's
    `in_flight_peak` over its 1F1B or interleaved action list, each chunk's micro-batch its
    layers x `layer_bytes` (the last chunk adds the loss's fp32 log-probabilities); DualPipe:
    p + 1 micro-batches of the larger of its two stages (DualPipe README's table,
    "Activation Per Device PP+1", against 1F1B's PP)."""
    spec, one = work.model, layer_bytes(work, L, recipe)
    log_probs = 4 * work.seq_len / L.cp * L.micro_batch * spec.vocab_size / L.tp
    chunks = chunk_ranges(spec, L)
    held = {c: len(layers) * one + (log_probs if c == len(chunks) - 1 else 0)
            for c, layers in enumerate(chunks)}
    if recipe.schedule == "dualpipe" and L.pp > 1:
        return (L.pp + 1) * max(held[rank], held[L.pp - 1 - rank])
    return in_flight_peak(schedule_actions(rank, L.pp, L.micro_batches, L.interleave), held)


def moe_memory(work, L, recipe=Recipe()):
    """Bytes on the busiest GPU: model state (`moe_cost.rank_state_bytes`), activations in
    flight (`rank_activations`), the largest transient; the most of any pipeline rank."""
    spec = work.model
    layers = max(len(stage_layers(spec, L, s)) for s in range(L.pp))
    one_layer = max(sum(stage_params(spec, L, s).values()) for s in range(L.pp)) / layers
    wide = replace(work, model=replace(spec, ffn=routed_width(work, L)))
    transient = transient_bytes(wide, L, one_layer, True)
    return max(rank_state_bytes(spec, L, r, recipe) + rank_activations(work, L, r, recipe)
               for r in range(L.pp)) + transient


def routed_width(work, L):
    """The MLP width a dense layer would need to hold an MoE layer's ffn-wide tensors: the
    busiest rank's routed rows a token (k x the imbalance) x moe_ffn, + the shared experts'
    width; at least the dense layers' ffn. What the transients (a layer recomputed in
    backward) are counted with."""
    spec, tokens = work.model, rank_tokens(L, work.seq_len)
    routed = routed_rows(spec, tokens, L.ep) / tokens * spec.moe_ffn
    return max(round(routed) + spec.n_shared_experts * spec.moe_ffn,
               spec.ffn if spec.first_dense or spec.moe_every > 1 else 0)


def _expert_layout(L):
    """`L` as the dense terms see the expert-data-parallel ranks: edp replicas over a span of
    the stage's dp x cp x tp ranks (ep innermost, torchtitan's sparse mesh)."""
    return replace(L, dp=L.grid.expert_data_parallel, cp=1, tp=L.ep)


def bubble_of(L, recipe):
    """The idle share of the step: lesson 06's (`bubble_share`), or DualPipe's (DeepSeek-V3
    report Table 2): (p/2 - 1)(F&B + B - 3W) against 1F1B's (p - 1)(F + B), taking F&B = F + B
    (no overlap credited), B = 2F and W = F (the weight gradients half of backward), so
    (p/2 - 1) 2F idle beside m (F + B) = 3mF of work."""
    if recipe.schedule == "1f1b" or L.pp == 1:
        return bubble_share(L)
    idle = (L.pp / 2 - 1) * 2
    return idle / (3 * L.micro_batches + idle)


def matmul_seconds(work, L, gpu, recipe):
    """(dense, experts) seconds of the busiest GPU's matmuls: the attention scores at the bf16
    rate, every linear layer at twice it with `recipe.fp8`; full recomputation a third more."""
    spec = work.model
    redo = 4 / 3 if L.recompute == "full" else 1
    scores = score_flops_per_token(spec, work.seq_len)
    scores *= redo + (1 / 6 if work.attention == "fused" else 0)  # FA-2 recomputes QK^T
    expert_flops = 6 * len(spec.moe_blocks) * spec.top_k * mlp_params(spec, spec.moe_ffn)
    linear = (6 * active_params(spec) - expert_flops) * redo
    speed = 2 if recipe.fp8 else 1
    tokens = work.batch_tokens / (L.replicas * L.pp)
    shape = shape_efficiency(spec, L.micro_batch * work.seq_len // L.cp, L.tp, gpu)
    dense = (scores + linear / speed) * tokens / L.tp / (gpu.peak_flops * gpu.matmul_efficiency
                                                         * shape)
    return dense, expert_seconds(spec, L, work.seq_len, gpu) * redo / speed


def ep_seconds(work, L, cluster, recipe):
    """The step's all-to-alls: lesson 09's (`all_to_all_seconds`) or DeepEP's."""
    if recipe.dispatcher == "deepep":
        return deepep_seconds(work.model, L, work.seq_len, cluster, recipe.fp8)
    return all_to_all_seconds(work.model, L, work.seq_len, cluster)


def elementwise_seconds(work, L, gpu):
    """The element-wise kernels (norms, activations, softmax, residuals, the routed rows'
    permutation) of the busiest stage, the dense planner's convention (`timing.elementwise_bytes`)
    on the MoE's own stored tensors: what `layer_bytes` saves without recomputation is written
    in the forward, read in the backward and its gradient written, 3 times (4 with full
    recomputation), at the GPU's memory bandwidth."""
    stored = layer_bytes(work, replace(L, recompute="none"))
    passes = 4 if L.recompute == "full" else 3
    layers = max(len(stage_layers(work.model, L, s)) for s in range(L.pp))
    return stored * passes * layers * L.micro_batches / gpu.hbm_bw


def moe_estimate(work, L, cluster, recipe=Recipe()):
    """An `Estimate` of layout `L` training the MoE `work` on `cluster`, run as `recipe` says
    (`moe_cost.Recipe`: lesson 09's plain all-to-alls in bf16 unless told)."""
    spec, gpu = work.model, cluster.gpu
    memory = moe_memory(work, L, recipe)
    dense, experts = matmul_seconds(work, L, gpu, recipe)
    bubble = bubble_of(L, recipe)
    compute = (dense + experts + elementwise_seconds(work, L, gpu)) / (1 - bubble)
    a2a = ep_seconds(work, L, cluster, recipe)
    if recipe.overlap:  # hidden behind the compute, which keeps 1 - comm_sm_share of the SMs
        compute /= 1 - recipe.comm_sm_share
        a2a = max(0.0, a2a - compute)
    tp, pp, cp = tp_time(work, L, cluster), pp_time(work, L, cluster), cp_time(work, L, cluster)
    heavy = max((stage_params(spec, L, s) for s in range(L.pp)),
                key=lambda p: p["dense"] + p["experts"])
    EL = _expert_layout(L)
    dp_dense, hide = dp_time(work, L, cluster, heavy["dense"])
    dp_experts, _ = dp_time(work, EL, cluster, heavy["experts"])
    exposed_dp = max(0.0, dp_dense + dp_experts - hide * (dense + experts))
    adam = optimizer_time(heavy["dense"], L, gpu) + optimizer_time(heavy["experts"], EL, gpu)
    step = compute + tp + cp + pp + a2a + exposed_dp + adam
    model_flops = active_flops_per_token(spec, work.seq_len) * work.batch_tokens
    return Estimate(
        L, memory, margin.fits(gpu, L, memory), step, compute, bubble, tp, cp, pp, exposed_dp,
        adam, work.batch_tokens / step, model_flops / (step * cluster.n_gpus * gpu.peak_flops),
        cluster.dollars_per_hour() * step / 3600 / (work.batch_tokens / 1e6), ep_time=a2a)
