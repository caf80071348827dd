"""What a mixture of experts adds to a layout's memory and step time (lesson 09,
`lessons/09_experts.ipynb`; issue 34). Every term is lesson 09's own count, scaled to a layout:

    chunk_ranges / stage_layers    # the layers of each (virtual) stage and pipeline rank
    stage_params(spec, L, stage)   # {"dense", "experts"} parameters on one GPU of a stage
    state_bytes(spec, L, recipe)   # model state of the busiest GPU, each part over its group
    routed_rows(spec, tokens)      # rows the experts of a rank compute for `tokens` tokens
    active_flops_per_token(spec)   # 6 x active parameters + the attention scores' 12 L h s
    all_to_all_bytes / _seconds    # lesson 09's k b s h (ep-1)/ep, four times a layer
    expert_seconds(...)            # the experts' matmuls on the busiest rank
    Recipe(...)                    # how the step is run beyond its layout (FP8, overlap, DeepEP)
    network_copies / deepep_seconds  # one copy a node over the network (DeepEP, DeepSeek-V3)

Where the experts live (torchtitan b5bcd76, 2026-08-21, distributed/parallel_dims.py; the grid's
`RankGrid.ep`): ep ranks borrowed from dp x cp x tp, innermost, each holding E/ep whole experts
(not split over tp); their gradients are reduced, and ZeRO shards their state, over the
`expert_data_parallel` ranks, dp x cp x tp / ep. The dense part (attention, norms, routers,
shared experts, the dense layers' MLPs) is split over tp (norms and routers replicated) and
reduced over dp x cp, as for a dense model.

Tokens a rank routes: each of its b x s / cp tokens is cut over the tp ranks before the
dispatch (torchtitan's TP + EP, Megatron-LM's sequence parallel with experts), so a rank sends
k x b x s / (cp tp) rows. Load imbalance (`routed_rows`): the busiest rank's experts receive
at most the capacity when a capacity factor c caps them (ceil(c k N / E) each, lesson 09's
`capacity`), else the model's dropless imbalance times the mean (`imbalance`: the spec's own,
or DROPLESS_IMBALANCE), each calibrated on a published pair (below, `published_moe.py`).
"""

import math
from dataclasses import dataclass, replace

from dlcourse.memory.accounting import model_state_bytes
from dlcourse.moe import capacity
from dlcourse.parallel.expert.measure import all_to_all_formula, all_to_all_time
from dlcourse.planner.estimate import chunk_layers
from dlcourse.planner.moe_spec import active_params, attention_params, mlp_params
from dlcourse.planner.timing import roofline_share

BYTES = 2  # bf16 parameters, gradients and activations (the planner's `timing.BYTES`)
# The busiest expert's rows against the mean when nothing caps them. Calibrated: the factor
# at which the planner's dropless step over its balanced one is Megatron-Core's measured
# ratio for Qwen3-235B at 16K tokens on 256 H100s, 295 / 237 TFLOPS (`published_moe`:
# `implied_imbalance` finds 1.93; the 32K to 128K rows held out). Switch Transformer (Fedus
# et al. 2022, §2.2) budgeted 1.25 (capacity factor 1.25), which real routing exceeds.
# DeepSeek-V3's auxiliary-loss-free balancing (report §2.1.2) publishes no figure. A model
# whose own published pair measures its routing keeps its own factor (`MoESpec.dropless_imbalance`:
# Mixtral's 8 experts, top-2, are far closer to balanced, `published_moe.MIXTRAL_PAIR`).
DROPLESS_IMBALANCE = 1.9


def chunk_ranges(spec, L):
    """The layer indices of each of the pipeline's pp x v (virtual) stages, in order: the
    dense planner's `chunk_layers` (ceil(L / chunks) each, the last the remainder; with light
    ends one layer fewer on the first and the last chunk, their slots the embedding's and the
    loss's, as Megatron-LM's --account-for-embedding/loss-in-pipeline-split)."""
    sizes = chunk_layers(spec.n_layers, L.pp * L.interleave, L.light_ends)
    starts = [sum(sizes[:c]) for c in range(len(sizes))]
    return [range(min(a, spec.n_layers), min(a + n, spec.n_layers))
            for a, n in zip(starts, sizes)]


def stage_layers(spec, L, stage):
    """Indices of the layers pipeline rank `stage` holds: its chunks stage, stage + pp, ...
    (v = 1: ceil(L/pp) a stage, the last the remainder)."""
    return [i for chunk in chunk_ranges(spec, L)[stage::L.pp] for i in chunk]


def stage_params(spec, L, stage):
    """{"dense": ..., "experts": ...} parameters on one GPU of pipeline `stage`: its layers'
    attention, shared experts and dense MLPs over tp, norms and routers whole, the embedding
    (first stage) and the head and final norm (last) over tp; E/ep whole experts of each of
    its MoE layers."""
    h, moe = spec.hidden, set(spec.moe_blocks)
    norm = 2 * h if spec.bias else h
    shared = mlp_params(spec, spec.n_shared_experts * spec.moe_ffn) if spec.n_shared_experts \
        else 0
    dense = experts = 0
    for i in stage_layers(spec, L, stage):
        split = attention_params(spec) + (shared if i in moe else mlp_params(spec, spec.ffn))
        dense += split / L.tp + 2 * norm + (spec.n_experts * h if i in moe else 0)
        experts += (spec.n_experts // L.ep) * mlp_params(spec, spec.moe_ffn) if i in moe else 0
    if stage == 0:
        dense += (spec.vocab_size * h + (spec.seq_len * h if spec.learned_positions else 0)) / L.tp
    if stage == L.pp - 1:
        dense += (spec.vocab_size * h if not spec.tied or L.pp > 1 else 0) / L.tp + norm
    return {"dense": dense, "experts": experts}


def state_bytes(spec, L, recipe=None):
    """Model state of the busiest GPU: the dense part's ZeRO state over dp x cp, the experts'
    over the expert-data-parallel ranks (lesson 05's (2 + 2 + 12) bytes a parameter, divided
    as the stage says, or `recipe.state_bytes`); the most of any pipeline rank. DualPipe
    (`recipe.schedule`) keeps two copies of the parameters: rank r holds stages r and
    p - 1 - r (DualPipe README's table, "Parameter Per Device 2x"), each with its state."""
    return max(rank_state_bytes(spec, L, r, recipe) for r in range(L.pp))


def rank_state_bytes(spec, L, rank, recipe=None):
    """Model state on one GPU of pipeline rank `rank` (`state_bytes`)."""
    stages = {rank, L.pp - 1 - rank} if recipe and recipe.schedule == "dualpipe" else {rank}
    weights, grads, optimizer = recipe.state_bytes if recipe else (2, 2, 12)
    scale = {"params": weights / 2, "grads": grads / 2, "optimizer": optimizer / 12}
    groups = {"dense": L.replicas, "experts": L.grid.expert_data_parallel}
    total = 0
    for s in stages:
        for part, n in stage_params(spec, L, s).items():
            if n:  # a stage may hold no experts (DeepSeek-V3's first, dense layers)
                parts = model_state_bytes(n, dp=groups[part], zero_stage=L.zero_stage)
                total += sum(getattr(parts, k) * f for k, f in scale.items())
    return total


def imbalance(spec):
    """The busiest expert's rows against the mean: the capacity factor, or dropless the
    model's own `dropless_imbalance` where the catalogue gives one, else DROPLESS_IMBALANCE."""
    return spec.capacity_factor or spec.dropless_imbalance or DROPLESS_IMBALANCE


def routed_rows(spec, tokens, ep=1):
    """Rows the E/ep experts of the busiest of ep ranks receive when each rank routes `tokens`
    tokens (k copies of each): with a capacity factor, each expert at most lesson 09's
    `capacity` of the group's ep x tokens, and all of them no more than the group's k x ep x
    tokens (at ep 1 the k x tokens it routes: the course's layer drops over the capacity but
    does not pad an expert up to it); dropless, the mean k x tokens times `imbalance(spec)`
    once the experts are spread (at ep 1 the one rank computes exactly the k x tokens rows,
    however they fall among its experts)."""
    if spec.capacity_factor:  # never more than the group's k x ep x tokens assignments
        cap = capacity(spec.capacity_factor, ep * tokens, spec.top_k, spec.n_experts)
        return min(spec.n_experts // ep * cap, spec.top_k * ep * tokens)
    return spec.top_k * tokens * (imbalance(spec) if ep > 1 else 1)


def score_flops_per_token(spec, seq_len):
    """The attention scores' forward and backward FLOPs of one token, no causal halving (the
    planner's dense convention): QK^T and PV are 2 s (d_qk + d_v) a head forward, 3x that in
    training, 6 L s H (d_qk + d_v); 12 L h s when a head is h / H wide, `head_dims` else."""
    if spec.head_dims is None:
        return 12 * spec.n_layers * spec.hidden * seq_len
    d_qk, d_v = spec.head_dims
    return 6 * spec.n_layers * seq_len * spec.n_heads * (d_qk + d_v)


def active_flops_per_token(spec, seq_len):
    """6 x the active parameters (lesson 09's `params_per_token`["active"], about 6 FLOPs each
    in training) + the attention scores' (`score_flops_per_token`)."""
    return 6 * active_params(spec) + score_flops_per_token(spec, seq_len)


def rank_tokens(L, seq_len):
    """Tokens one rank routes per micro-batch: b s / (cp tp)."""
    return L.micro_batch * seq_len / (L.cp * L.tp)


def all_to_all_bytes(spec, L, seq_len):
    """Bytes that leave one rank in one all-to-all of one MoE layer, one micro-batch, routing
    uniform: lesson 09's `all_to_all_formula`, k b s h (ep-1)/ep, bf16, b s the rank's tokens."""
    return all_to_all_formula(replace(spec, seq_len=1), rank_tokens(L, seq_len), L.ep, BYTES)


def all_to_all_seconds(spec, L, seq_len, cluster):
    """The step's all-to-alls on one GPU: dispatch and combine, forward and backward (4 a MoE
    layer and micro-batch) with lesson 09's `all_to_all_time` (alpha-beta, ep - 1 messages),
    over NVLink when the ep ranks (consecutive, innermost) share a node, the network otherwise;
    the busiest stage's MoE layers, m micro-batches; on the critical path."""
    if L.ep == 1:
        return 0.0
    alpha, bw = cluster.link(L.ep)
    one = all_to_all_time(replace(spec, seq_len=1), rank_tokens(L, seq_len), L.ep, alpha,
                          1 / bw, BYTES)
    layers = max(len(set(stage_layers(spec, L, s)) & set(spec.moe_blocks)) for s in range(L.pp))
    return 4 * one * layers * L.micro_batches


def expert_seconds(spec, L, seq_len, gpu):
    """The experts' matmuls of the busiest rank and stage: 6 FLOPs a weight for each row its
    E/ep experts receive (`routed_rows`, imbalance included), at the GPU's sustained matmul
    rate."""
    rows = routed_rows(spec, rank_tokens(L, seq_len), L.ep)
    flops = 6 * rows * mlp_params(spec, spec.moe_ffn)
    layers = max(len(set(stage_layers(spec, L, s)) & set(spec.moe_blocks)) for s in range(L.pp))
    return flops * layers * L.micro_batches / (gpu.peak_flops * gpu.matmul_efficiency)


def expert_gemms(spec, L, seq_len):
    """(M, K, N) of one local expert's forward matmuls on the busiest rank, one micro-batch:
    M its rows (`routed_rows` over the E/ep experts a rank holds), up (and gate) h -> moe_ffn,
    down moe_ffn -> h. A grouped GEMM runs E/ep of each. What the planner times at the
    sustained rate whatever M is (`expert_seconds`); `timing.shape_efficiency`'s roofline
    applied to them says where a thin M would be memory-bound (`published_moe`, the misses)."""
    rows = routed_rows(spec, rank_tokens(L, seq_len), L.ep) / (spec.n_experts // L.ep)
    up = spec.moe_ffn * (2 if spec.gated_mlp else 1)
    return [(rows, spec.hidden, up), (rows, spec.moe_ffn, spec.hidden)]


def expert_roofline(spec, L, seq_len, gpu):
    """The share of the sustained matmul rate `expert_gemms` keep by the roofline (bf16
    operands and result through HBM, `timing.roofline_share`): 1.0 when compute-bound."""
    return roofline_share(expert_gemms(spec, L, seq_len), gpu)


DISPATCHERS = ("a2a", "deepep")
SCHEDULES = ("1f1b", "dualpipe")
RECOMPUTE_MODULES = ("layernorm", "moe_act", "mla_up_proj")  # `moe_activations.RECOMPUTED`


@dataclass(frozen=True)
class Recipe:
    """How an MoE step is run beyond its layout; the default is lesson 09's plain all-to-all
    in bf16 on the critical path. Each field is something a published run did:"""
    dispatcher: str = "a2a"  # "a2a": every routed copy is its own message (lesson 09);
    #   "deepep": one copy a destination node over the network, fanned out there on NVLink
    #   (DeepSeek-V3 report §3.2.2; deepseek-ai/DeepEP; Megatron-Core's "flex" dispatcher)
    overlap: bool = False  # the all-to-alls hidden behind another micro-batch's compute
    #   (DualPipe, report §3.2.1; Megatron-Core's --overlap-moe-expert-parallel-comm)
    comm_sm_share: float = 0.0  # SMs the communication kernels hold while overlapping:
    #   the compute runs on the rest (report §3.2.2: 20 of the H800's 132)
    fp8: bool = False  # the linear layers' GEMMs in FP8 at twice the bf16 rate (report §3.3.1:
    #   "theoretically doubles"; attention, embedding, head, router and norms stay bf16), the
    #   dispatch and the gradient sent back to the experts in FP8, both combines bf16 (§3.3.3)
    schedule: str = "1f1b"  # or "dualpipe": (p/2 - 1)(F&B + B - 3W) idle (report Table 2;
    #   deepseek-ai/DualPipe 030ce43 README)
    recompute_modules: tuple = ()  # what the run recomputes, Megatron-Core's
    #   --recompute-modules names: "layernorm", "moe_act", "mla_up_proj" (`moe_activations`)
    fp8_activations: bool = False  # Linear inputs cached in FP8 (DeepSeek-V3 §3.3.3)
    probs_in_activation: bool = False  # the router's weight of a routed row multiplied into
    #   its activation's output, inside the expert, not into its h-wide output at the combine
    #   (lesson 09's `combine`): Megatron-Core's experts (d98e8a6 and the Qwen3 rows'
    #   1e05700595, experts.py, TEGroupedMLP: weighted_bias_swiglu_impl unless
    #   --no-bias-swiglu-fusion; unpermute gets no probs), so no expert output is kept,
    #   only the row's fp32 weight (`moe_activations`)
    state_bytes: tuple = (2, 2, 12)  # (weights, gradients, optimizer) bytes a parameter:
    #   lesson 05's mixed precision; Megatron-LM with bf16 keeps fp32 gradients (2, 4, 12);
    #   DeepSeek-V3 fp32 gradients, fp32 master and bf16 moments (2, 4, 8) (§3.3.3)

    def __post_init__(self):
        if self.dispatcher not in DISPATCHERS or self.schedule not in SCHEDULES:
            raise ValueError(f"Recipe: dispatcher in {DISPATCHERS}, schedule in {SCHEDULES}")
        unknown = set(self.recompute_modules) - set(RECOMPUTE_MODULES)
        if unknown:
            raise ValueError(f"Recipe: recompute_modules {sorted(unknown)} not in "
                             f"{RECOMPUTE_MODULES}")


def network_copies(spec, ep, gpus_per_node):
    """Copies of one token the network carries in one dispatch when each goes once to each
    other node holding one of its experts (the ep ranks on n = ep / gpus_per_node nodes, each
    node E / n experts): routing uniform, a node is missed by all k experts with probability
    C(E - E/n, k) / C(E, k), so (n - 1)(1 - that) other nodes; node-limited routing
    (`route_nodes` M) picks M of the n nodes, (n - 1) M / n of them other."""
    n = max(1, ep // gpus_per_node)
    if n == 1:
        return 0.0
    if spec.route_nodes:
        return (n - 1) * min(spec.route_nodes, n) / n
    E, k = spec.n_experts, spec.top_k
    return (n - 1) * (1 - math.comb(E - E // n, k) / math.comb(E, k))


def deepep_seconds(spec, L, seq_len, cluster, fp8=False):
    """The step's four all-to-alls a MoE layer with DeepEP-style dispatch: the network part,
    `network_copies` x h values a token; the NVLink part, the k copies fanned out inside
    the node ((g - 1)/g of them leave a GPU); the slower of the two, as they run at once.
    With `fp8` the forward dispatch and its backward twin (the gradients before the experts'
    down-projections) send 1 byte a value, the two combines bf16."""
    if L.ep == 1:
        return 0.0
    tokens, g = rank_tokens(L, seq_len), min(L.ep, cluster.gpus_per_node)
    byte_sum = 2 * (1 if fp8 else BYTES) + 2 * BYTES  # four all-to-alls' bytes a value
    net = network_copies(spec, L.ep, cluster.gpus_per_node) * tokens * spec.hidden * byte_sum
    nvl = spec.top_k * (g - 1) / g * tokens * spec.hidden * byte_sum
    alpha, _ = cluster.link(L.ep)
    one_layer = max(net / cluster.gpu.inter_bw, nvl / cluster.gpu.intra_bw) + 4 * (
        L.ep - 1) * alpha
    layers = max(len(set(stage_layers(spec, L, s)) & set(spec.moe_blocks)) for s in range(L.pp))
    return one_layer * layers * L.micro_batches
