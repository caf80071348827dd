"""Published mixture-of-experts runs, held against the planner (lesson 09's planner; issue 34).
Calibration: two published pairs, dropless against forced balance, each set one model's
busiest expert's rows against the mean when nothing caps them: Megatron-Core's Qwen3-235B at
16K tokens sets `moe_cost.DROPLESS_IMBALANCE`, which every model without its own gets
(`LONG_CONTEXT`'s first row, `implied_imbalance`; its other three rows are held out,
`dropless_slowdown`), and its Mixtral 8x22B pair sets the catalogue's `MIXTRAL_IMBALANCE`
(`MIXTRAL_PAIR`, `pair_imbalance`), both in `moe_imbalance.py`. All the runs of `RUNS` are held
out.
The dense planner's calibrated constant is `calibration.py`'s, from a dense layer; what each
run did beyond its layout is its `Recipe` (`moe_cost.py`), read from its source, not fitted.

DeepSeek-AI 2024, "DeepSeek-V3 Technical Report": 2,048 H800 GPUs, 8 a node on NVLink/NVSwitch,
InfiniBand across (§3.1; §3.2.2: "IB (50 GB/s)", "NVLink (160 GB/s)"); 16-way pipeline
(DualPipe), 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor
parallelism (§3.2); 4,096-token sequences, a batch of 15,360 of them after the ramp (§4.2);
"180K H800 GPU hours" for each trillion tokens (§1; Table 1). The H800 here is an H100 SXM
(same 989 TFLOPS bf16, HBM and memory) with the report's link rates. Its recipe, each from
the report: the linear layers' GEMMs and the dispatch in FP8 (§3.3); DualPipe's bubble (Table
2) and its overlap of the all-to-alls with computation (§3.2.1: cross-node EP's
"computation-to-communication ratio of approximately 1:1", "fully hidden"), 20 of the 132 SMs
kept for communication (§3.2.2); tokens sent once over IB to each of at most 4 nodes and
forwarded on NVLink (§2.1.2, §3.2.2: the catalogue's `route_nodes`,
`Recipe(dispatcher="deepep")`). Read in a copy of the report's arXiv HTML (v2) on 2026-11-29.
Its memory, as the report ran it (`Recipe`): RMSNorm and MLA's up-projections recomputed
(§3.2.3: Megatron's "layernorm" and "mla_up_proj"), the SwiGLU output recomputed and its input,
the experts' input and every Linear's input cached in FP8, the attention output in E5M6
(§3.3.3: "moe_act", `fp8_activations`; `moe_activations.py`), fp32 gradients, fp32 master
weights and bf16 Adam moments (§3.3.3: `state_bytes` (2, 4, 8)), DualPipe's two copies of
the parameters and p + 1 micro-batches in flight (DualPipe README, 3da1bbe, its table; report
Table 2). What a routed row keeps for its combine weight's gradient the report does not say
(§3.3.3 only that both combines are bf16). DeepEP's training combine (deepseek-ai/DeepEP
dd758ca, README and deep_ep/buffers/legacy.py) sums the expert outputs sent back; each row's
top-k weight travels with the dispatch to the expert's rank (recv_topk_weights), so it is
applied there. Megatron-Core, which runs DeepSeek-V3 with the same DeepEP (its flex
dispatcher), applies it to the activation's output inside the expert, so keeps no h-wide
expert output (`Recipe.probs_in_activation`, cited there), and with the SwiGLU output
recomputed from its cached input, as the report does, that costs nothing more. The planner
models DeepSeek-V3 as Megatron-Core does; the report does not confirm it. It still finds the
layout does not fit (`memory_miss`): about 103 GB on the busiest GPU (77 GB with routing
balanced). The term that differs is the routed rows' imbalance: the planner gives every
layer of every micro-batch in flight the busiest rank's rows, DROPLESS_IMBALANCE = 1.9 x the
mean, a step-time factor (each layer waits for its busiest rank) calibrated on Qwen3's
auxiliary-loss routing. A rank's memory is the sum of its own rows over the layers and
micro-batches it holds, each layer with its own busiest rank; no source gives how that sum
falls, nor the imbalance of DeepSeek-V3's auxiliary-loss-free routing (§2.1.2), so the
factor stays as an upper bound, and the layout fits only if a rank's rows are at most about
1.2 x the mean over what it holds (`test_deepseek_v3s_memory_miss_is_the_imbalance`). The
EMA kept in CPU memory and the MTP module's embedding and head shared with the main model
(§3.2.3) are not counted in the first place. The MTP module's own block (§2.2: one more MoE
layer) is left out too: it sits on the PP rank of the deepest layers (§3.2.3), with DualPipe
the rank of stages 0 and 15, already the busiest for holding the embedding and the head;
counted as a 62nd layer it adds about 3 GB there
(`test_deepseek_v3s_mtp_block_adds_to_the_busiest_gpu`), the side the miss is on: leaving it
out does not make the miss.
What else the planner does not represent:
- recomputing MLA's up-projections and the SwiGLU output is not timed (about 2% of the
  FLOPs);
- the multi-token-prediction module (§2.2: one more MoE block and the head again, about 4%
  more FLOPs) is left out, and the FP8 GEMMs are taken at exactly twice the bf16 sustained
  rate (the report's "theoretically doubles"; its fine-grained scaling and promotion to CUDA
  cores every 128 elements, §3.3.2, are overlapped "without introducing substantial overhead");
- the published figure is a whole run's GPU-hours (restarts, evaluation, checkpoints), the
  estimate a step's;
- DeepSeek-V3 drops no token (§2.1.2), so its busiest expert gets the planner's dropless
  factor, calibrated on Qwen3-235B's auxiliary-loss routing; the report's auxiliary-loss-free
  balancing may do better, which would make the planner faster still.
Each makes the planner faster than the report, the side it errs on.

Megatron-Core's MoE model zoo (yanring/Megatron-MoE-ModelZoo 798dfb5, 2026-05-13,
best_practice/qwen3/readme.md, "Performance Results", H100): Qwen3-235B-A22B on 256 H100s
(NVLink 4, "InfiniBand 8x50 GB/s"), bf16, 4,096-token sequences, global batch 2,048, micro-
batch 1, the step time in seconds of each row. The reference command of those rows
(best_practice/qwen3/run_h100_235b.sh) forces balanced routing
(--moe-router-force-load-balancing): the runs here give the spec a capacity factor of 1,
each expert exactly its share (lesson 09's `capacity`). The rows' recompute "norm, act" is the
script's --recompute-granularity selective --recompute-modules moe_act layernorm
(`Recipe.recompute_modules`; row 5 recomputes nothing), not timed, as for DeepSeek-V3.
Megatron's "distributed optimizer" (model_configs/benchmarking/Qwen3-235B-A22B.yaml,
--use-distributed-optimizer) is ZeRO-1 over dp, the experts' over EDP (the readme's column);
with --bf16 and no --grad-reduce-in-bf16 Megatron-LM accumulates gradients in fp32
(NVIDIA/Megatron-LM d98e8a6, 2026-08-22, megatron/training/arguments.py: "bfloat16 requires
gradient accumulation and all-reduce to be done in fp32", main_grads_dtype fp32), so the state
is (2, 4, 12) bytes a parameter (`MEGATRON_STATE`); the precision-aware optimizer and
optimizer offload are only in the script's fp8/mxfp8 and OPTIMIZER_OFFLOAD=1 branches, not
these bf16 rows. Pipeline: the yaml sets --account-for-embedding-in-pipeline-split and
--account-for-loss-in-pipeline-split and runtime_configs/benchmarking/runtime.conf gives
Qwen3-235B-A22B NUM_LAYERS 96 ("Account loss and embedding for number of layers"): 96 slots
cut evenly over pp x v, the first virtual stage's embedding and the last's loss in a layer's
slot, the planner's `light_ends` (94 + 2 = 96 over 32 or 96 virtual stages: whole). With
these, every row's layout passes the rule book and fits in an H100's 80 GiB with the
published runs' margin (no allocator reserve, as `published.py` holds the dense runs; the
script runs PyTorch's allocator with expandable_segments:True, segments that grow rather than
new ones, against fragmentation): 54, 54, 57 and 54 GiB, with the routers' weights applied in
the activation as Megatron-Core's experts do (`Recipe.probs_in_activation`); they fit with the
planner's 16% reserve for a run not yet launched too (`margin.ALLOCATOR`). The script and
yaml are the zoo's at 798dfb5; the readme's rows name the Megatron-LM they ran (moe_dev
f3e6c5, main 1e057005: at 1e05700595, 2025-05-24, TEGroupedMLP already applies the probs in
its activation and the dispatchers' unpermute gets none, as at d98e8a6).
- cross-node EP (TP 2, EP 32, PP 8, VPP 4, DP 16; DeepEP): 19.7 s; with "+1f1b overlap" (its
  EP all-to-alls overlapped, DeepEP's 20 SMs, Megatron-Core's moe_deepep_num_sms): 17.6 s;
- intra-node EP with the plain all-to-all dispatcher (TP 2, EP 8, PP 32, VPP 3, DP 4): 24.2 s,
  and with DeepEP at TP 4, EP 8, PP 8, VPP 4, DP 8 and no recomputation: 29.0 s. The planner
  predicts both over 40% faster: documented misses. What the sources give (read 2026-11-29 at
  798dfb5): run_h100_235b.sh has only the cross-node command (rows 1 and 2: DISPATCHER=deepep,
  A2A_OVERLAP=1, cuda graphs of "moe_router moe_preprocess"); these two rows have no command,
  only the table (their dispatcher column: "A2A", sbatch_benchmarking.sh's
  --moe-token-dispatcher-type alltoall, and "DeepEP", its flex dispatcher with the deepep
  backend); the yaml every row shares sets --moe-grouped-gemm, --moe-permute-fusion,
  --moe-router-fusion and --moe-router-dtype fp32. The term the table does fix is the size of
  each expert's GEMM (`moe_cost.expert_gemms`): rows 1 and 2 give each of their 4 local
  experts 4,096 rows a micro-batch (8 x 2,048 tokens x 32 ranks / 128 experts), row 4 each of
  its 16 1,024 and row 5 (TP 4: 1,024 tokens a rank) 512, for the same FLOPs a rank (row 5
  twice the micro-batches of half the tokens). The table's own intra-node row 3 (EP 8, DeepEP,
  PP 1, FSDP, micro-batch 4: 4,096 rows each of its 16 experts, full recomputation; not held
  here, the planner has no FSDP of experts) takes 17.6 s, as fast as the overlapped cross-
  node row: so the misses go with the small expert GEMMs (row 3 runs 4 micro-batches of 4
  sequences a step), not with EP inside a node. The planner's roofline
  (`moe_cost.expert_roofline`, `timing.shape_efficiency`'s) finds even 512 x 4,096 x 3,072
  compute-bound on an H100, so it cannot produce the miss; what a grouped GEMM keeps at 512
  to 1,024 rows an expert (tile and wave quantisation over 16 groups, the fp32 main-gradient
  accumulation of 16 experts' weights each micro-batch) would take a measurement on an H100,
  which this planner has not made.
  The nearest published figures are FP8 on an H800 (deepseek-ai/DeepGEMM README at 327ec92,
  2025-04-09): 1,346 TFLOPS for 8 groups of 4,096 rows (n 4,096, k 7,168) and 1,040 for 2
  groups of 512 (its masked layout), 23% less. And the term is bounded: the experts' matmuls
  are about 5 s of the planner's 13.6 s and 15.1 s, so even at half the rate they would leave
  the rows 23% and 31% short. Left as misses, with that term named and bounded
  (`test_the_qwen3_misses_are_the_small_expert_gemms`): the rest is not found.
Megatron-Core's Mixtral runs: its all-to-all dispatcher, bf16, 4,096-token sequences, global
batch 256, micro-batch 1, dropless with Megatron's auxiliary loss (coefficient 1e-2), no
recomputation, the distributed optimizer (ZeRO-1 over dp, the experts' over EDP), fp32 gradients
(`MEGATRON_STATE`); H100s, 8 a node (the README's benchmark: NVLink 4, "InfiniBand 8x400
Gbit/s"). The time metric is Megatron-LM's logged TFLOP/s a GPU, turned into seconds a step with
Megatron's own FLOP count of the time (`megatron_flops`):
- Mixtral 8x22B on 128 H100s (MIXTRAL_ZOO, at 38ce2ed, 2026-03-10; the figures written on
  2025-12-16, 31942f0 and b09773a, when Megatron-LM's count halved the causal scores): TP 2, EP
  8 (inside a node), PP 8, VPP 7, DP 8 (runtime_configs/benchmarking/runtime.conf;
  model_configs/benchmarking/Mixtral-8x22B.yaml; --expert-tensor-parallel-size 1: whole experts;
  the script's bf16 branch adds --tp-comm-overlap, which the planner does not model: its TP
  time, 3% of the step, stays exposed). "Dropless training with forced balancing, performance
  should be around 465 TFLOPS for H100" (`MIXTRAL_8X22B_RUN`, each expert its share as for the
  Qwen3 rows) and "Dropless training, stable performance should be around 445TFLOPS": the pair
  whose ratio sets Mixtral's imbalance, 1.06 (`pair_imbalance`), against the 1.9 of Qwen3-235B's
  128 experts. Its Megatron (ff45bd4255, 2025-12-15, experts.py) applies the routers' weights
  inside the experts' fused SwiGLU (`Recipe.probs_in_activation`; the workload's mlp "fused").
- Mixtral 8x7B on 64 H100s (NVIDIA/Megatron-LM c230e0d7c2, 2024-11-21, megatron/core/
  transformer/moe/README.md): "With MCore v0.9 ... 468 TFLOPS for Mixtral 8X7B bf16 training",
  its "Reference Best Parallel Mapping" table: Mixtral 8x7B (Dropless), vocabulary 32K,
  All-to-All, BF16, 64 GPUs, sequence 4,096, TP 1, EP 8, PP 4, VP 8, micro-batch 1, global batch
  256 (the table says "of MCore v0.8"; the same commit set its "Docker Image" to PyTorch 24.09
  with TransformerEngine v1.11, the v0.9 run's; at 0b981f9c53, 2024-08-02, the v0.8 figure was
  438 TFLOPS, which the planner is about 9% under). The README's example script runs Mixtral
  8x7B with --use-distributed-optimizer and no recomputation; its experts.py of that commit
  takes no router weights, so they are applied at the combine and its h-wide output kept
  (`Recipe()`'s default); its TEGroupedMLP runs the fused bias_swiglu_impl (mlp "fused"). Its
  FLOP count then did not halve the causal scores (`causal=False`). Held out with Mixtral's own
  imbalance from the 8x22B pair (`MIXTRAL_8X7B_RUN`); at Qwen3's 1.9 the planner would be 58%
  over it.
Not held: the script's FP8 row (blockwise FP8, forced balance, 560 TFLOPS): the planner takes
FP8 GEMMs at twice the bf16 rate (`Recipe.fp8`, DeepSeek-V3's "theoretically doubles"), and
the zoo's 560 against 465 is 1.2x, so the planner would be about 30% under it
(`test_the_mixtral_fp8_row_is_what_the_fp8_rate_misses`).
The Qwen3 readme's (ZOO) "Long Context" table (H100, DeepEP, bf16, 32 nodes, TP 4, PP 8, VPP 4,
EP 8, global batch 256, no all-to-all overlap; its command recomputes the norms and the MoE
layers) gives each length's TFLOPS a GPU with forced balance and dropless: their ratio is the
step-time cost of real routing's imbalance. The planner's ratio comes from the busiest rank's
expert rows only (`moe_cost.routed_rows`), timed with full recomputation (the closest it has to
recomputing the MoE layers); `implied_imbalance` finds the factor that matches a row.
"""

from dataclasses import dataclass, replace

from dlcourse.planner import margin
from dlcourse.planner.catalog import DEEPSEEK_V3, MIXTRAL_8X7B, MIXTRAL_8X22B, QWEN3_235B
from dlcourse.planner.hardware import GB, Cluster, gpu
from dlcourse.planner.layouts import Layout, Workload, problems
from dlcourse.planner.moe_cost import Recipe
from dlcourse.planner.moe_estimate import moe_estimate

H800 = replace(gpu("h100"), name="h800", intra_bw=160 * GB, inter_bw=50 * GB)
DEEPEP_SMS = 20 / 132  # DeepSeek-V3 §3.2.2; DeepEP's and Megatron-Core's default, of 132 SMs


@dataclass(frozen=True)
class MoERun:
    name: str
    work: Workload
    cluster: Cluster
    layout: Layout
    recipe: Recipe
    step_time: float  # published seconds per step (or derived from GPU-hours, `DEEPSEEK_V3_RUN`)
    source: str
    miss: str = ""  # why the planner misses its step time, when it does
    memory_miss: str = ""  # why the planner says it does not fit, when it does


def gpu_hours_per_t_tokens(step_time, run):
    """GPU-hours to train on 10^12 tokens at one step per `step_time` seconds."""
    return 1e12 / (run.work.batch_tokens / step_time) * run.cluster.n_gpus / 3600


DS_TOKENS = 15360 * 4096
DEEPSEEK_V3_RUN = MoERun(
    "DeepSeek-V3 pre-training, 2,048 H800", Workload(DEEPSEEK_V3, 4096, DS_TOKENS),
    Cluster(H800, 2048),
    Layout(128, 1, 16, zero_stage=1, micro_batch=1, micro_batches=120, ep=64),
    Recipe(dispatcher="deepep", overlap=True, comm_sm_share=DEEPEP_SMS, fp8=True,
           schedule="dualpipe", recompute_modules=("layernorm", "mla_up_proj", "moe_act"),
           fp8_activations=True, state_bytes=(2, 4, 8), probs_in_activation=True),
    # 180K GPU-hours a trillion tokens on 2,048 GPUs, as seconds a step of DS_TOKENS:
    180e3 * 3600 / 2048 * DS_TOKENS / 1e12,
    "DeepSeek-V3 Technical Report §1, Table 1, §2.1.2, §3.1-3.3, §4.2",
    memory_miss="every layer in flight holds the busiest rank's routed rows, 1.9 x the mean, "
                "an upper bound (module docstring)")

QWEN3 = Workload(replace(QWEN3_235B, capacity_factor=1.0), 4096, 2048 * 4096, mlp="fused")
ZOO = "yanring/Megatron-MoE-ModelZoo 798dfb5 best_practice/qwen3/readme.md, H100 table"
NORM_ACT = ("layernorm", "moe_act")  # the rows' recompute "norm, act"
MEGATRON_STATE = (2, 4, 12)  # bf16 weights, fp32 gradients, fp32 master and moments


def _qwen3_layout(dp, tp, pp, v, ep):
    """A row's layout: micro-batch 1 of GBS 2,048; 94 layers + the embedding's and the loss's
    slots, 96, cut evenly over pp x v (the light ends; module docstring)."""
    return Layout(dp, tp, pp, zero_stage=1, micro_batches=2048 // dp, interleave=v,
                  light_ends=True, ep=ep)


QWEN3_RUNS = [
    MoERun("Qwen3-235B cross-node EP, DeepEP", QWEN3, Cluster(gpu("h100"), 256),
           _qwen3_layout(16, 2, 8, 4, 32),
           Recipe(dispatcher="deepep", recompute_modules=NORM_ACT, state_bytes=MEGATRON_STATE,
                  probs_in_activation=True),
           19.7, ZOO + ", row 1"),
    MoERun("Qwen3-235B cross-node EP, DeepEP + overlap", QWEN3, Cluster(gpu("h100"), 256),
           _qwen3_layout(16, 2, 8, 4, 32),
           Recipe(dispatcher="deepep", overlap=True, comm_sm_share=DEEPEP_SMS,
                  recompute_modules=NORM_ACT, state_bytes=MEGATRON_STATE,
                  probs_in_activation=True), 17.6,
           ZOO + ", row 2"),
    MoERun("Qwen3-235B intra-node EP, all-to-all, PP 32", QWEN3, Cluster(gpu("h100"), 256),
           _qwen3_layout(4, 2, 32, 3, 8),
           Recipe(recompute_modules=NORM_ACT, state_bytes=MEGATRON_STATE,
                  probs_in_activation=True), 24.2,
           ZOO + ", row 4",
           miss="1,024 rows an expert a GEMM, 4x fewer than the runs held (module docstring)"),
    MoERun("Qwen3-235B intra-node EP, DeepEP, TP 4", QWEN3, Cluster(gpu("h100"), 256),
           _qwen3_layout(8, 4, 8, 4, 8),
           Recipe(dispatcher="deepep", state_bytes=MEGATRON_STATE,
                  probs_in_activation=True), 29.0, ZOO + ", row 5",
           miss="512 rows an expert a GEMM, 8x fewer than the runs held (module docstring)"),
]


def megatron_flops(spec, seq_len, sequences, causal=True):
    """The FLOPs Megatron-LM counts for a step of `sequences` x `seq_len` tokens (megatron/
    training/training.py, num_floating_point_operations: the numerator of its logged "TFLOP/s/
    GPU") of a model whose every layer is MoE and whose heads are h / H wide: per token
    12 L h (h + h g/H + s/2) for attention (projections and scores, g key/value groups), 12 L h
    moe_ffn k 3/2 for the k routed SwiGLU experts, 6 h V for the logits. `causal=False`: the
    score term s, not s/2, as Megatron-LM counted before 8873b55 (2025-03-06) halved it."""
    h, L, s = spec.hidden, spec.n_layers, seq_len
    scores = s / 2 if causal else s
    attention = 12 * L * h * (h + h * spec.kv_heads / spec.n_heads + scores)
    experts = 12 * L * h * spec.moe_ffn * spec.top_k * 3 / 2
    return sequences * s * (attention + experts + 6 * h * spec.vocab_size)


def step_from_tflops(work, n_gpus, tflops, causal=True):
    """Seconds a step of `work` at `tflops` TFLOP/s a GPU as Megatron-LM counts them."""
    flops = megatron_flops(work.model, work.seq_len, work.sequences, causal)
    return flops / (tflops * 1e12 * n_gpus)


MIXTRAL_ZOO = "yanring/Megatron-MoE-ModelZoo 38ce2ed best_practice/mixtral/run_mixtral_8x22B.sh"
X22_WORK = Workload(replace(MIXTRAL_8X22B, capacity_factor=1.0), 4096, 256 * 4096, mlp="fused")
X22_CLUSTER = Cluster(gpu("h100"), 128)  # 16 nodes of 8
MIXTRAL_8X22B_RUN = MoERun(
    "Mixtral 8x22B, all-to-all, forced balance", X22_WORK, X22_CLUSTER,
    Layout(8, 2, 8, zero_stage=1, micro_batches=256 // 8, interleave=7, ep=8),
    Recipe(state_bytes=MEGATRON_STATE, probs_in_activation=True),
    step_from_tflops(X22_WORK, 128, 465), MIXTRAL_ZOO + ": 465 TFLOPS")
# (the run, TFLOPS with forced balance, dropless): the zoo's pair, `MIXTRAL_IMBALANCE`'s source
MIXTRAL_PAIR = (MIXTRAL_8X22B_RUN, 465, 445)

X7_WORK = Workload(MIXTRAL_8X7B, 4096, 256 * 4096, mlp="fused")  # dropless
MIXTRAL_8X7B_RUN = MoERun(
    "Mixtral 8x7B, all-to-all, dropless", X7_WORK, Cluster(gpu("h100"), 64),
    Layout(16, 1, 4, zero_stage=1, micro_batches=256 // 16, interleave=8, ep=8),
    Recipe(state_bytes=MEGATRON_STATE), step_from_tflops(X7_WORK, 64, 468, causal=False),
    "NVIDIA/Megatron-LM c230e0d7c2 megatron/core/transformer/moe/README.md: 468 TFLOPS")
MIXTRAL_RUNS = [MIXTRAL_8X22B_RUN, MIXTRAL_8X7B_RUN]
RUNS = [DEEPSEEK_V3_RUN, *QWEN3_RUNS, *MIXTRAL_RUNS]


def held_against(run):
    """{"name", "planner": the planner's step time, "published", "error": planner /
    published - 1, "problems": what the rule book says of the layout, "miss", "fits": the
    estimate's memory in the GPU with the margin of a run known to have fitted (no allocator
    reserve, `margin.fits`), "memory_miss"}."""
    e = moe_estimate(run.work, run.layout, run.cluster, run.recipe)
    fits = margin.fits(run.cluster.gpu, run.layout, e.memory, allocator=0)
    return {"name": run.name, "planner": e.step_time, "published": run.step_time,
            "error": e.step_time / run.step_time - 1, "miss": run.miss, "fits": fits,
            "memory_miss": run.memory_miss,
            "problems": problems(run.layout, run.work, run.cluster), "estimate": e}


def deepseek_v3(run=DEEPSEEK_V3_RUN):
    """DeepSeek-V3 as the report ran it and as the planner would plainly run it: {"problems",
    "memory": bytes on the busiest GPU as the report ran it, "fits" (no: `memory_miss`),
    "fits_full_recompute": the same layout with every layer recomputed, "planner" and "published":
    GPU-hours a trillion tokens, "error", "plain": the same layout in bf16, lesson 09's
    all-to-alls on the critical path, 1F1B, full recomputation (what the planner alone
    would assume)}."""
    found = held_against(run)
    full = replace(run.layout, recompute="full")
    plain = moe_estimate(run.work, full, run.cluster)
    return {"problems": found["problems"], "memory": found["estimate"].memory,
            "fits": found["fits"], "fits_full_recompute": plain.fits,
            "planner": gpu_hours_per_t_tokens(found["planner"], run),
            "published": gpu_hours_per_t_tokens(run.step_time, run), "error": found["error"],
            "plain": gpu_hours_per_t_tokens(plain.step_time, run)}
