"""The published training runs the planner is held against (lesson 07; `published.py` holds
the planner against them, tests/test_planner.py prints the comparison), as data: each run's
model, cluster, the layout its authors used and the speed (and, where stated, memory) reported.

Sources (A100 80 GB on DGX A100 nodes unless said; GPT: vocabulary 51,200, sequence 2,048):
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Table 1 (weak scaling, 1.7B to 1T) and Table 2 (PTD-P rows, 175B and 530B at
  three GPU counts). Their teraFLOP/s per GPU counts the recomputed forward (96 B s l h^2
  (1 + s/6h + V/16lh)): full recomputation; sequence parallelism and the distributed
  optimizer came later: off, ZeRO stage 0; eager attention (no FlashAttention in 2021).
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  Tables 3 and 5: 22B, 175B, 530B and 1T, iteration time with full recomputation (no
  sequence parallelism) and with their selective recomputation + sequence parallelism;
  interleaving with 3 stages for 175B and 530B (§6); no data parallelism; and §6.3's 530B
  at 8-way data parallelism (2,240 GPUs, 39.15 s).
- torchtitan, docs/performance.md, "Llama 2 performance numbers" (added in commit 395a526,
  2024-04-18; the table left the file on 2024-12-03): FSDP2 (ZeRO-3) on 64 A100 80 GB, Llama 2
  at 4,096 tokens, local batch 2, SDPA (fused) attention; the rows without recomputation (13B)
  and with full recomputation (70B). WPS is tokens per second per GPU (its MFU column checks
  it: 2,162 x 6Ψ-and-attention FLOPs = 61% of 312 TFLOPS). The network is not stated: one
  200 Gb/s port per GPU, as on DGX A100, is assumed. Its SwiGLU is plain PyTorch
  (torchtitan/models/llama/model.py at 395a526: w2(F.silu(w1(x)) * w3(x))): mlp "eager";
  its model returns output(h).float() and train.py keeps that `pred` through loss.backward():
  loss "fp32 eager, pred kept" (`transients.py`).
- BigScience BLOOM-176B, bigscience-workshop/bigscience, train/tr11-176B-ml: tr11-176B-ml.slurm
  (TP 4, PP 12, micro-batch 2, global batch 2,048 of 2,048 tokens, 70 layers of 14,336 with
  112 heads, vocabulary padded to 250,880, ALiBi, tied embeddings, --checkpoint-activations,
  DeepSpeed's bf16 optimizer: ZeRO-1's sharding, DeepSpeed's plain 1F1B) and README.md (384
  A100 80 GB in 48 nodes, each with 4 Omni-Path links, 100 Gb/s each: 6.25 GB/s a GPU; the
  first epoch's last iteration, 85,376: 104.70 s).
- Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B on H100 80 GB,
  TP 8, PP 16, 8,192 tokens, 16M tokens a batch; BF16 MFU. §3.3.2: FSDP that shards the
  optimizer state and gradients and does not reshard the weights after forward, no
  activation checkpointing for 8K sequences, and "we reduce one Transformer layer each from
  the first and the last stages" (`Layout.light_ends`). The long-context row of Table 4:
  TP 8, CP 16, PP 16, DP 8 on 16,384 GPUs at 131,072 tokens, 38% BF16 MFU; §3.3.2's context
  parallelism all-gathers K and V and leaves that on the critical path (`timing.cp_time`).
  The paper does not say how it counts attention FLOPs; the planner's MFU counts every query
  against every key (6Ψ + 12 L h s, PaLM's count, no causal halving). At 128K the attention
  term is 57% of that count: were Meta's MFU counted with causal attention as half, the
  planner's prediction in their count would be 29% lower (at 8K, 4%). Left open, so searched:
  interleaving (§3.3.2 describes an interleaved schedule with a tuned number of back-to-back
  micro-batches, not v) and the SwiGLU kernel (`Workload.mlp`: not stated).

- Megatron-LM's README (NVIDIA/Megatron-LM at d98e8a6, 2026-08-22; its "Model table" image,
  images/model_table.png): weak scaling on H100, 1.7B to 462B at 4,096 tokens, vocabulary
  131,072, tp 1-8, pp 1-16, dp 48, on 48 to 6,144 GPUs, MFU 41-49% (`MEGATRON_H100`). Every
  other row calibrates the H100 SXM (below). The 1.7B (h 2,048, tp 1) was 30% optimistic until
  the loss's kernels were timed (`timing.loss_time`: its vocabulary of 131,072 beside h 2,048
  makes the fp32 cross-entropy 6% of the step); it is still the most optimistic H100 row.

- torchtitan's H100 tables for Llama 3.1 8B (benchmarks/llama3_h100_202412_torchtitan.md,
  added in commit 820504e, 2025-06-13; runs of 2024-12 at torchtitan 9dec370), Tables 1 and 3:
  FSDP on 8 and 128 GPUs, 8,192 tokens, local batch 2, torchtitan's per-op selective
  checkpointing (recompute "op", `op_checkpoint.py`), SDPA attention, eager SwiGLU, loss "fp32
  eager"; bf16 without and with torch.compile (5,762 / 6,667 and 5,605 / 6,514 tokens/s/GPU;
  the Float8 rows are left out: the planner counts bf16 matmuls only). Their GPUs are not
  `GPUS["h100"]`: Grand Teton's H100 with 96 GB of HBM2e at 2.4 TB/s under a 500 W power limit
  (the SXM's is 700 W), whose peak the source says lies "between SXM and NVL" and is unknown
  (`TORCHTITAN_H100`). That is WHY the planner was optimistic here: on a datasheet SXM (with
  the loss timed) it predicts 7,807 and 7,837 tokens/s/GPU for the eager rows (+35%, +40%);
  at 2.4 TB/s, 7,612 and 7,651 (+32%, +37%): the memory explains 3 points, the rest is in the
  share (0.53 against the SXM's 0.72): the power limit's lower clock, the eager kernels and
  the unknown peak, which these rows cannot tell apart. So a GPU of its own, calibrated on one
  of its runs (Table 1's eager FSDP row, 8 GPUs) and checked on the other three. The
  planner has no term for what torch.compile fuses (the norms, rotary, SwiGLU's kernels run
  eagerly here): the compiled rows are held out with the eager rows' prediction, 12-14% slow.

The split (`PublishedRun.role`): each GPU's in-step share of its MAMF (`hardware.py`) is fitted
on the runs marked "calibration" on that GPU (`calibration.fit_share`): for the A100, one
layer measured by Korthikanti et al. (Table 4, not a run below); for the H100 SXM, Megatron-
LM's README rows 1, 3, 5, 7 and 9 (every other one, smallest to largest); for torchtitan's
500 W H100, its Table 1 FSDP row. Every other run is "held out": none of its numbers sets
anything.

The same file states memory per GPU (GiB): torchtitan's "max_reserved" (train.py at 9dec370
logs torch.cuda's reserved_bytes.all.peak: what the caching allocator held, with
expandable_segments on in run_llama_train.sh), not what tensors used. The planner's memory is
the peak of what tensors use (`estimate.peak_memory`): it assumes reserved = allocated, so
it can only be low, by the allocator's cache. No row comes within `MEMORY_TOLERANCE`, so none
is listed. With every term the source code gives (loss "fp32 eager", `transients.py`), per row:
- Table 2, Llama 3.1 8B, FSDP x CP = 8, full checkpointing, local batch 1, 32,768 tokens a GPU
  (Float8 and compile: Table 1 reads 77.0 GiB compiled, 76.8 with Float8, and Table 3 62.0 and
  61.8, so Float8 moves memory by 0.3%; compile is per block, the loss stays eager): the
  planner 70.3 GiB for each of the four rows against 83.9, 84.2, 84.0 and 84.5 (-16%, -16%,
  -16%, -17%). Its parts: model state 15.0 (16 bytes a parameter over 8), the 32 block
  inputs 8.0, the loss at its backward 47.0 (12 bytes a logit x 4.2 G logits), the last block
  unsharded 0.4. Left out, 13.6-14.2 GiB: what the allocator reserves beyond the peak it
  allocates (were the freed bf16 logits too small a hole for log_softmax's fp32 gradient,
  reserved peaks at 14 bytes a logit: +7.8 GiB; the planner cannot know the allocator's
  placement) and the gradient temporaries of each op's backward; counted and not there: the
  sharded fp32 gradients (3.7 GiB), which torchtitan's zero_grad frees before forward.
- Table 4, Llama 3.1 70B, FSDP 32 x TP 8, local batch 16 at 8,192 tokens: 47.8 against 71.9
  (-34%). Left out besides the above: torchtitan's loss runs tensor-parallel (loss_parallel,
  DTensor's log_softmax and nll_loss over vocabulary shards), whose temporaries the planner
  takes as the eager loss's 12 bytes a local logit, and AsyncTP's gathered inputs.
- Table 5, Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, 1F1B, local batch 32 (8 micro-batches of 4,
  the pp degree: torchtitan's default, pipeline_llama.py), reshard_after_forward=False under
  pipelining (the stage's bf16 parameters kept, 11.8 GiB, counted): 41.5 against 82.5 (-50%).
  Left out besides the above: unsharded gradients accumulated over the micro-batches, if the
  schedule defers the reduce-scatter to the last one (11.8 GiB in bf16; not checked). The
  interleaved row, Table 6 (stages a rank not stated) and Tables 1 and 3 (per-op
  checkpointing, above) are not tried.
"""

from dataclasses import dataclass, replace

from dlcourse.memory.calculator import REAL_MODELS, ModelSpec
from dlcourse.planner.catalog import LLAMA3_405B, LLAMA31_8B, megatron_gpt
from dlcourse.planner.hardware import GPUS, H100_500W_SHARE, Cluster
from dlcourse.planner.layouts import Layout, Workload

CALIBRATION = "calibration"  # a run whose GPU's in-step share is fitted on it (`calibration.py`)
HELD_OUT = "held out"  # a run none of whose numbers enters the planner


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    work: Workload
    cluster: Cluster
    layout: Layout  # the published grid, batch split and stated settings
    metric: str  # "tflops" (Megatron's formula), "seconds" a step, "mfu", "tokens/s/GPU"
    value: float  # what the source reports
    free: tuple = ()  # layout fields the source leaves open (searched)
    memory: float = None  # bytes per GPU the source reports, if it does
    memory_miss: str = ""  # why the planner finds no room for the published layout, if it doesn't
    speed_miss: str = ""  # why the planner misses this run by more than TOLERANCE, if it does
    role: str = HELD_OUT  # or CALIBRATION: its GPU's in-step share is fitted on it


A100 = GPUS["a100-80gb"]
FULL = dict(recompute="full", sequence_parallel=False)


def _gpt(heads, hidden, layers):
    return megatron_gpt(f"GPT {heads}h {hidden} x {layers}", heads, hidden, layers)


def _narayanan(table, heads, hidden, layers, tp, pp, gpus, batch, tflops):
    dp = gpus // (tp * pp)
    layout = Layout(dp, tp, pp, micro_batch=1, micro_batches=batch // dp, **FULL)
    work = Workload(_gpt(heads, hidden, layers), 2048, batch * 2048, attention="eager")
    return PublishedRun(f"GPT {hidden}x{layers} on {gpus}", f"Narayanan et al. 2021, {table}",
                        work, Cluster(A100, gpus), layout, "tflops", tflops,
                        free=("interleave",))


def _korthikanti(heads, hidden, layers, pp, gpus, batch, micro, v, seconds, selective):
    tp, dp = 8, gpus // (8 * pp)
    settings = dict(recompute="selective", sequence_parallel=True) if selective else FULL
    layout = Layout(dp, tp, pp, micro_batch=micro, micro_batches=batch // (dp * micro),
                    interleave=v, **settings)
    work = Workload(_gpt(heads, hidden, layers), 2048, batch * 2048, attention="eager")
    how = "selective + SP" if selective else "full recompute"
    return PublishedRun(f"GPT {hidden}x{layers} on {gpus}, {how}",
                        "Korthikanti et al. 2022, Tables 3, 5" + ("" if dp == 1 else ", §6.3"),
                        work, Cluster(A100, gpus), layout, "seconds", seconds)


def _torchtitan(name, local_batch, recompute, wps):
    spec = REAL_MODELS[name]
    layout = Layout(64, 1, 1, zero_stage=3, micro_batch=local_batch, recompute=recompute)
    work = Workload(spec, 4096, 64 * local_batch * 4096, attention="fused", mlp="eager",
                    loss="fp32 eager, pred kept")
    return PublishedRun(f"{name} FSDP on 64", "torchtitan docs/performance.md", work,
                        Cluster(A100, 64), layout, "tokens/s/GPU", wps)


BLOOM = ModelSpec("BLOOM 176B", 70, 14336, 112, vocab_size=250880, seq_len=2048, ffn=4 * 14336,
                  kv_heads=112, gated_mlp=False, bias=True, tied=True, learned_positions=False,
                  dropout=True)  # the slurm sets no --*-dropout: Megatron's default, 0.1
OMNI_PATH_A100 = replace(A100, name="a100-80gb, 4 x 100 Gb/s Omni-Path a node",
                         inter_bw=4 * 100e9 / 8 / 8)  # 4 links x 100 Gb/s shared by 8 GPUs


def _bloom():
    layout = Layout(8, 4, 12, zero_stage=1, micro_batch=2, micro_batches=128, **FULL)
    return PublishedRun("BLOOM 176B on 384", "BigScience tr11-176B-ml (slurm, README)",
                        Workload(BLOOM, 2048, 2048 * 2048, attention="eager"),
                        Cluster(OMNI_PATH_A100, 384), layout, "seconds", 104.70)


def _llama3(gpus, dp, per_dp, mfu, cp=1, seq_len=8192):
    layout = Layout(dp, 8, 16, zero_stage=3, micro_batch=1, micro_batches=per_dp,
                    reshard=False, light_ends=True, cp=cp)
    context = f", {seq_len // 1024}K context" if cp > 1 else ""
    return PublishedRun(f"Llama 3 405B on {gpus}{context}", "Dubey et al. 2024, Table 4",
                        Workload(LLAMA3_405B, seq_len, dp * per_dp * seq_len, attention="fused"),
                        Cluster(GPUS["h100"], gpus), layout, "mfu", mfu,
                        free=("interleave", "mlp"))


MEGATRON_H100 = [  # (heads, hidden, layers, tp, pp, GPUs, batch, MFU): NVIDIA/Megatron-LM README
    (16, 2048, 24, 1, 1, 48, 192, 0.41), (32, 4096, 30, 2, 1, 96, 192, 0.47),  # (d98e8a6,
    (48, 6144, 32, 4, 1, 192, 192, 0.49), (56, 7168, 48, 8, 1, 384, 192, 0.46),  # 2026-08-22),
    (64, 8192, 84, 8, 2, 768, 384, 0.42), (80, 10240, 92, 8, 4, 1536, 768, 0.43),  # its table
    (96, 12288, 96, 8, 6, 2304, 1152, 0.44), (128, 16384, 96, 8, 8, 3072, 1536, 0.48),  # image
    (144, 18432, 112, 8, 16, 6144, 3072, 0.47)]  # images/model_table.png: 1.7B to 462B


def _megatron_h100(heads, hidden, layers, tp, pp, gpus, batch, mfu):
    """Megatron-LM's weak-scaling table on H100 (README, "Model table"): a GPT (4h MLP, untied,
    its parameter counts check: 1.7B, 7.1B, ...) at 4,096 tokens, vocabulary 131,072, data
    parallel 48, with the distributed optimizer (ZeRO-1: --overlap-param-gather needs it) and
    TE's fused attention. The micro-batch, recomputation and interleaving are not stated:
    searched. The MFU is compared in the planner's count (6Ψ + 12 L h s); the README does not
    say whether its count halves causal attention (today's training.py does)."""
    spec = ModelSpec(f"Megatron GPT {hidden}x{layers}", layers, hidden, heads,
                     vocab_size=131072, seq_len=4096, ffn=4 * hidden, kv_heads=heads,
                     gated_mlp=False, bias=True, tied=False, learned_positions=False)
    dp = gpus // (tp * pp)
    layout = Layout(dp, tp, pp, zero_stage=1, micro_batch=1, micro_batches=batch // dp)
    row = [r[1] for r in MEGATRON_H100].index(hidden)
    return PublishedRun(f"Megatron GPT {hidden}x{layers} on {gpus}", "Megatron-LM README (H100)",
                        Workload(spec, 4096, batch * 4096), Cluster(GPUS["h100"], gpus), layout,
                        "mfu", mfu, free=("interleave", "micro_batch", "recompute"),
                        role=CALIBRATION if row % 2 == 0 else HELD_OUT)  # rows 1, 3, .. 9


# torchtitan's H100 (benchmarks/llama3_h100_202412_torchtitan.md, "Hardware"): Grand Teton, 96 GB
# HBM2e at 2.4 TB/s, NVLink inside the host, 400 Gb/s RDMA a GPU, a 500 W power limit. Its peak
# is unknown ("between SXM and NVL"): the SXM's 989 TFLOPS, which torchtitan divides by for its
# MFU, and the SXM's MAMF are kept, and what the power limit takes is in its fitted share.
TORCHTITAN_H100 = replace(GPUS["h100"], name="h100 96GB HBM2e 500 W",
                          memory=96 * 1e9,  # "96GB" as the source says (no nvidia-smi figure)
                          hbm_bw=2.4e12, in_step_share=H100_500W_SHARE,
                          source="torchtitan benchmarks/llama3_h100_202412_torchtitan.md")


def _torchtitan_h100(gpus, compiled, wps):
    """torchtitan's Llama 3.1 8B, FSDP over `gpus`, local batch 2 at 8,192 tokens, per-op
    selective checkpointing, bf16 (Tables 1 and 3); `compiled`: torch.compile on each block."""
    layout = Layout(gpus, 1, 1, zero_stage=3, micro_batch=2, recompute="op")
    work = Workload(LLAMA31_8B, 8192, gpus * 2 * 8192, attention="fused", mlp="eager",
                    loss="fp32 eager")
    table = "Table 1" if gpus == 8 else "Table 3"
    how = " + compile" if compiled else ""
    return PublishedRun(f"Llama 3.1 8B FSDP{how} on {gpus} (500 W)",
                        f"torchtitan H100 benchmarks, {table}", work,
                        Cluster(TORCHTITAN_H100, gpus), layout, "tokens/s/GPU", wps,
                        role=CALIBRATION if (gpus, compiled) == (8, False) else HELD_OUT)


RUNS = [
    _narayanan("Table 1", 24, 2304, 24, tp=1, pp=1, gpus=32, batch=512, tflops=137),  # 1.7B
    _narayanan("Table 1", 32, 3072, 30, tp=2, pp=1, gpus=64, batch=512, tflops=138),  # 3.6B
    _narayanan("Table 1", 32, 4096, 36, tp=4, pp=1, gpus=128, batch=512, tflops=142),  # 7.5B
    _narayanan("Table 1", 48, 6144, 40, tp=8, pp=1, gpus=256, batch=1024, tflops=135),  # 18.4B
    _narayanan("Table 1", 64, 8192, 48, tp=8, pp=2, gpus=512, batch=1536, tflops=138),  # 39.1B
    _narayanan("Table 1", 80, 10240, 60, tp=8, pp=4, gpus=1024, batch=1792, tflops=140),  # 76B
    _narayanan("Table 1", 96, 12288, 80, tp=8, pp=8, gpus=1536, batch=2304, tflops=148),  # 146B
    _narayanan("Table 1", 128, 16384, 96, tp=8, pp=16, gpus=1920, batch=2160, tflops=155),
    _narayanan("Table 1", 128, 20480, 105, tp=8, pp=35, gpus=2520, batch=2520, tflops=163),
    _narayanan("Table 1", 160, 25600, 128, tp=8, pp=64, gpus=3072, batch=3072, tflops=163),  # 1T
    *[_narayanan("Table 2", 96, 12288, 96, tp=8, pp=12, gpus=g, batch=1536, tflops=t)
      for g, t in ((384, 153), (768, 149), (1536, 141))],  # GPT-3 175B
    *[_narayanan("Table 2", 128, 20480, 105, tp=8, pp=35, gpus=g, batch=2240, tflops=t)
      for g, t in ((560, 171), (1120, 167), (2240, 159))],  # MT-NLG 530B
    *[_korthikanti(*shape, seconds=t, selective=sel)
      for shape, times in [((64, 6144, 48, 1, 8, 4, 4, 1), (1.42, 1.10)),  # 22B
                           ((96, 12288, 96, 8, 64, 64, 1, 3), (18.13, 13.75)),  # 175B
                           ((128, 20480, 105, 35, 280, 280, 1, 3), (49.05, 37.83)),  # 530B
                           ((160, 25600, 128, 64, 512, 512, 1, 1), (94.42, 71.49))]  # 1T
      for sel, t in ((False, times[0]), (True, times[1]))],
    _korthikanti(128, 20480, 105, 35, 2240, 2240, 1, 3, seconds=39.15, selective=True),
    _torchtitan("Llama-2 13B", 2, "none", wps=2162),
    _torchtitan("Llama-2 70B", 2, "full", wps=353),
    _bloom(),
    _llama3(8192, 64, 32, mfu=0.43),
    _llama3(16384, 128, 16, mfu=0.41),
    _llama3(16384, 8, 16, mfu=0.38, cp=16, seq_len=131072),  # the long-context stage
    *[_megatron_h100(*row) for row in MEGATRON_H100],
    *[_torchtitan_h100(g, compiled, wps) for g, compiled, wps in
      ((8, False, 5762), (8, True, 6667), (128, False, 5605), (128, True, 6514))],
]
