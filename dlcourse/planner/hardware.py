"""GPUs and clusters as the planner sees them (lesson 07): memory, peak speed, the matmul speed
actually sustained, memory bandwidth, links, price.

Compute. `peak_flops` is the datasheet's dense bf16 tensor-core FLOP/s (no 2:4-sparsity
doubling). No kernel reaches it: `mamf` is the fraction a large bf16 matmul
sustains, Bekman's "Maximum Achievable Matmul FLOPS" (MAMF, ml-engineering,
compute/accelerator/README.md, measured with torch.matmul over a sweep of large shapes,
CUDA 12.1): A100 SXM 267.9 of 312 TFLOPS (85.9%), H100 SXM 792.1 of 989 (80.1%). The H200 has
the H100's compute (its MAMF there: 794.5, 80.3%). No MAMF is published there for the L40S and
RTX 4090: they get 0.80, the lowest NVIDIA figure in that table, an assumption said as such.
Inside a training step a matmul keeps less of its MAMF (`in_step_share`): it shares the GPU
with NCCL's kernels, waits on launches, runs at the model's shapes. That share is fitted per
GPU on published runs of that GPU (`calibration.py`; which runs calibrate and which are held
out is each run's `role`, published_runs.py): the A100's on Korthikanti et al.'s measured
layer (IN_LAYER_SHARE), the H100 SXM's on five of Megatron-LM's nine H100 rows (H100_SHARE).
The H200 (the H100's compute) takes the H100's share, the L40S and RTX 4090 the A100's: no
published run of theirs is held against the planner, an assumption said as such.
`matmul_efficiency` = MAMF x share. Thin matmuls sustain less again
(`timing.shape_efficiency`: the roofline at `hbm_bw`).

Memory (`memory`, bytes): what the driver reports, not the "80 GB" it is sold as. The cards
carry binary capacities; nvidia-smi's memory.total (modal-labs/modal-client PR #2797,
2025-01-23, nvidia-smi on each card): H100 80GB 81,559 MiB, A100 80GB 81,920 MiB, A100 40GB
40,960 MiB, L40S 46,068 MiB; H200 143,771 MiB and RTX 4090 24,564 MiB as nvidia-smi prints
them in public logs. CUDA hands the allocator a little less (torch's total_memory, the
driver's totalGlobalMem: 81,090 MiB on an H100 80GB, 0.6% less), which the planner keeps
free with the CUDA context, NCCL's buffers and the allocator's reserve (`margin.py`).

Memory bandwidth (`hbm_bw`, bytes/s, datasheets): A100 40 GB 1,555 GB/s, A100 80 GB SXM
2,039 GB/s, H100 SXM 3.35 TB/s, H200 4.8 TB/s, L40S 864 GB/s (GDDR6), RTX 4090 1,008 GB/s
(GDDR6X). It times what is not a matmul: the optimizer step and the element-wise kernels.

Links: the bandwidth one GPU has in one direction:
- inside a node, NVLink: A100 600 GB/s and H100/H200 900 GB/s in total both ways, so 300 and
  450 GB/s each way; the L40S has no NVLink: PCIe 4.0 x16, 32 GB/s each way. The RTX 4090 has
  peer-to-peer disabled by its driver (NVIDIA/nccl#1127, NVIDIA/nccl-tests#269: 8 x 4090
  all-reduces far below PCIe), so NCCL stages every message through host memory: it crosses
  PCIe twice, and we take half of PCIe's 32 GB/s (a model, not a measurement) and 20 us to start;
- between nodes, one InfiniBand port per GPU as in DGX systems: HDR 200 Gb/s (25 GB/s) on A100,
  NDR 400 Gb/s (50 GB/s) on H100/H200; PCIe cards are assumed to sit behind 100 Gb/s Ethernet.
alpha, the time to start one message, is a few microseconds on these links (lesson 02's model).

Prices: the cheapest on-demand list price per GPU-hour of one provider, from the
toolshedlabs-hash/gpu-price-feed snapshot of 2026-07-23 (read from each provider's API):
DataCrunch for the SXM cards and the L40S, RunPod for the RTX 4090. Prices change weekly and
differ threefold between providers: pass your own (`GPU.with_price`, `--price`).
"""

from dataclasses import dataclass, replace

GB = 1e9
MiB = 2 ** 20
# Of the MAMF, kept inside a training step, fitted per GPU on its calibration runs
# (`calibration.py` derives each; tests/test_planner.py holds them to it):
IN_LAYER_SHARE = 0.73  # A100: Korthikanti et al. 2022, Table 4's layer
H100_SHARE = 0.72  # H100 SXM: Megatron-LM's README rows 1, 3, 5, 7, 9 (published_runs.py)
H100_500W_SHARE = 0.53  # torchtitan's 500 W HBM2e H100: its Table 1 FSDP row (published_runs)
PRICE_CAVEAT = ("prices: one provider's on-demand list price on 2026-07-23 "
                "(gpu-price-feed); yours will differ: pass --price")


@dataclass(frozen=True)
class GPU:
    name: str
    memory: float  # bytes of device memory, as nvidia-smi reports it (MiB, above)
    peak_flops: float  # dense bf16 tensor-core FLOP/s, from the datasheet
    intra_bw: float  # bytes/s one way to another GPU in the node
    inter_bw: float  # bytes/s one way to a GPU in another node
    price: float  # dollars per GPU-hour (one provider, one date: PRICE_CAVEAT)
    source: str  # where the memory, peak, bandwidth and price figures come from
    hbm_bw: float = 2e12  # bytes/s of device memory bandwidth, from the datasheet
    mamf: float = 0.8  # MAMF / peak: what a lone large bf16 matmul sustains (Bekman)
    in_step_share: float = IN_LAYER_SHARE  # of the MAMF, kept in a training step (fitted)
    intra_alpha: float = 5e-6  # seconds to start one message inside a node
    inter_alpha: float = 10e-6  # ... between nodes

    @property
    def matmul_efficiency(self):
        """Share of peak the matmuls sustain inside a training step: MAMF x in-step share."""
        return self.mamf * self.in_step_share

    def with_price(self, price):
        return replace(self, price=price)


A100_80GB = GPU("a100-80gb", 81920 * MiB, 312e12, 300 * GB, 25 * GB, 1.79,
                "NVIDIA A100 datasheet (SXM): 312 TFLOPS bf16 dense, 2,039 GB/s, NVLink 600 "
                "GB/s; MAMF 85.9% (Bekman); DataCrunch A100 SXM4 80GB", hbm_bw=2039 * GB,
                mamf=0.859)
H100 = GPU("h100", 81559 * MiB, 989e12, 450 * GB, 50 * GB, 3.25,
           "NVIDIA H100 datasheet (SXM): 989 TFLOPS bf16 dense, 3.35 TB/s, NVLink 900 GB/s; "
           "MAMF 80.1% (Bekman); DataCrunch H100 SXM5 80GB", hbm_bw=3350 * GB, mamf=0.801,
           in_step_share=H100_SHARE)
GPUS = {g.name: g for g in [
    replace(A100_80GB, name="a100-40gb", memory=40960 * MiB, price=1.29, hbm_bw=1555 * GB,
            source="NVIDIA A100 datasheet (SXM): 312 TFLOPS bf16 dense, 1,555 GB/s, NVLink "
                   "600 GB/s; MAMF 85.9% (Bekman); DataCrunch A100 SXM4 40GB"),
    A100_80GB,
    H100,
    replace(H100, name="h200", memory=143771 * MiB, price=4.00, hbm_bw=4800 * GB, mamf=0.803,
            source="NVIDIA H200 datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, the H100's compute; "
                   "MAMF 80.3% (Bekman); DataCrunch H200 SXM5 141GB"),
    GPU("l40s", 46068 * MiB, 362e12, 32 * GB, 12.5 * GB, 1.37,
        "NVIDIA L40S datasheet: 48 GB GDDR6 at 864 GB/s, 362 TFLOPS bf16 dense, PCIe 4.0 x16, "
        "no NVLink; MAMF assumed 80%; DataCrunch L40S 48GB", hbm_bw=864 * GB,
        mamf=0.80),
    GPU("rtx-4090", 24564 * MiB, 165e12, 16 * GB, 12.5 * GB, 0.34,
        "NVIDIA Ada Lovelace architecture whitepaper: RTX 4090 24 GB GDDR6X at 1,008 GB/s, "
        "165 TFLOPS bf16 dense (fp32 accumulate), PCIe 4.0 x16, no NVLink and no peer-to-peer; "
        "MAMF assumed 80%; RunPod", hbm_bw=1008 * GB, mamf=0.80,
        intra_alpha=20e-6),
]}


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    n_gpus: int  # GPUs in the job
    gpus_per_node: int = 8  # GPUs that share the fast (intra-node) links

    def __post_init__(self):
        for name in ("n_gpus", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Cluster.{name} must be a whole number >= 1, got {value!r}")

    def link(self, span):
        """(alpha, bytes/s) of the slowest link a group of `span` consecutive GPUs uses: NVLink
        (or PCIe) if they fit in one node, the network otherwise."""
        if span <= self.gpus_per_node:
            return self.gpu.intra_alpha, self.gpu.intra_bw
        return self.gpu.inter_alpha, self.gpu.inter_bw

    def dollars_per_hour(self):
        return self.gpu.price * self.n_gpus


def gpu(name):
    """The GPU called `name` (case and spaces ignored), or a ValueError listing the known ones."""
    key = name.lower().replace(" ", "-").replace("_", "-")
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (or build a GPU(...))")
    return GPUS[key]
