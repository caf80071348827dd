"""GPUs and clusters as the planner sees them (lesson 07): memory, peak speed, links, price.

Every figure is the vendor's datasheet number (dense bf16 tensor-core FLOP/s, without the
2:4-sparsity doubling), so a planner result can be traced back to its inputs. Prices are
illustrative on-demand cloud prices per GPU-hour for late 2024; they change often and differ by
provider, so pass your own (`GPU.with_price`, `--price` on the command line).

Links are the bandwidth one GPU has in one direction:
- inside a node, NVLink: A100 600 GB/s and H100/H200 900 GB/s in total both ways, so 300 and
  450 GB/s each way; cards without NVLink use PCIe 4.0 x16, 32 GB/s each way;
- between nodes, one InfiniBand port per GPU as in DGX systems: HDR 200 Gb/s (25 GB/s) on A100,
  NDR 400 Gb/s (50 GB/s) on H100/H200; PCIe cards are assumed to sit behind 100 Gb/s Ethernet.
alpha, the time to start one message, is a few microseconds on these links (lesson 02's model).
"""

from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    memory: float  # bytes of device memory (as sold: 80 GB = 80e9)
    peak_flops: float  # dense bf16 tensor-core FLOP/s, from the datasheet
    intra_bw: float  # bytes/s one way to another GPU in the node
    inter_bw: float  # bytes/s one way to a GPU in another node
    price: float  # dollars per GPU-hour (illustrative; pass your own)
    source: str  # where the memory and peak figures come from
    intra_alpha: float = 5e-6  # seconds to start one message inside a node
    inter_alpha: float = 10e-6  # ... between nodes

    def with_price(self, price):
        return replace(self, price=price)


GPUS = {g.name: g for g in [
    GPU("a100-40gb", 40 * GB, 312e12, 300 * GB, 25 * GB, 1.3,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM): 312 TFLOPS bf16 dense, NVLink 600 GB/s"),
    GPU("a100-80gb", 80 * GB, 312e12, 300 * GB, 25 * GB, 1.8,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM): 312 TFLOPS bf16 dense, NVLink 600 GB/s"),
    GPU("h100", 80 * GB, 989e12, 450 * GB, 50 * GB, 2.5,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense, NVLink 900 GB/s"),
    GPU("h200", 141 * GB, 989e12, 450 * GB, 50 * GB, 3.5,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, same compute as H100"),
    GPU("l40s", 48 * GB, 362e12, 32 * GB, 12.5 * GB, 1.0,
        "NVIDIA L40S datasheet: 48 GB GDDR6, 362 TFLOPS bf16 dense, PCIe 4.0 x16, no NVLink"),
    GPU("rtx-4090", 24 * GB, 165e12, 32 * GB, 12.5 * GB, 0.4,
        "NVIDIA Ada Lovelace architecture whitepaper: RTX 4090 24 GB, 165 TFLOPS bf16 dense "
        "(fp32 accumulate), PCIe 4.0 x16, no NVLink"),
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
