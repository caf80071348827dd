"""The memory a real GPU leaves a training step (lesson 07's planner). The planner counts what
tensors hold at the step's peak (`estimate.peak_memory`); a GPU holds more, and a layout is
recommended only if the count plus all of this fits in what the driver reports:

- the driver's own share: CUDA hands the process totalGlobalMem, less than nvidia-smi's total
  (81,090 of 81,559 MiB on an H100 80GB: 0.6%; `hardware.py`);
- the CUDA context: the kernels loaded into it (torch, cuBLAS, NCCL's), cuBLAS's workspaces.
  Since CUDA 12.2 kernels load lazily (NVIDIA, CUDA programming guide, "Lazy Loading"), so it
  grows with what runs; we reserve CUDA_CONTEXT, an assumption said as such (torch's
  memory_allocated docs say only that "some context needs to be created on GPU");
- NCCL's buffers: each communicator keeps, for each channel and each peer it talks to, a
  staging buffer of NCCL_BUFFSIZE = 4 MiB by default (NCCL user guide, "Environment
  Variables"), one to send and one to receive; with up to 32 channels on NVLink (NCCL_MAX_
  NCHANNELS' usual H100 value) that is 2 x 32 x 4 MiB = 256 MiB a communicator (a model: NCCL
  sizes its channels per topology). A rank joins one communicator per grid axis of size > 1
  (tp, cp, dp, pp groups) and the world's;
- the caching allocator's reserve above what tensors use (fragmentation, freed blocks kept
  for reuse, and the backward's small temporaries the planner does not count): torchtitan
  logs torch.cuda's reserved peak ("max_reserved", benchmarks/llama3_h100_202412_torchtitan.md,
  9dec370), and on its Table 2 rows for Llama 3.1 8B the reserved peak is 83.9-84.5 GiB where
  the planner counts 70.3 GiB of tensors (`published_runs.py`): 16-17% above the count. ALLOCATOR
  takes the lower, 16%, of the peak the planner counts.

    usable_memory(gpu, layout) - (1 + ALLOCATOR) * peak >= 0   # `fits`
"""

GiB = 2 ** 30
MiB = 2 ** 20
DRIVER_SHARE = 1 - 81090 / 81559  # totalGlobalMem over nvidia-smi's total, H100 80GB
CUDA_CONTEXT = 1 * GiB  # assumption: kernels, cuBLAS workspaces (lazy loading, CUDA >= 12.2)
NCCL_BUFFSIZE = 4 * MiB  # NCCL's default staging buffer, per channel, peer and direction
NCCL_CHANNELS = 32  # channels of a communicator on NVLink (an H100 node)
ALLOCATOR = 0.16  # reserved above the counted peak: torchtitan's 8B rows (see above)


def communicators(layout):
    """Communicators a rank of `layout` joins: one per grid axis of size > 1, and the world."""
    return 1 + sum(size > 1 for size in (layout.dp, layout.cp, layout.tp, layout.pp))


def nccl_bytes(layout):
    """NCCL's staging buffers on one rank: send and receive x channels x BUFFSIZE for each
    communicator it joins."""
    return communicators(layout) * 2 * NCCL_CHANNELS * NCCL_BUFFSIZE


def margin_parts(gpu, layout, peak, allocator=ALLOCATOR):
    """{what: bytes} a GPU holds beyond the `peak` the planner counts."""
    return {"driver": DRIVER_SHARE * gpu.memory, "CUDA context": CUDA_CONTEXT,
            "NCCL buffers": nccl_bytes(layout), "allocator": allocator * peak}


def fits(gpu, layout, peak, allocator=ALLOCATOR):
    """True when the counted `peak` and the margin fit in the GPU's memory. `allocator`: the
    allocator's share to keep (0 for a run that is known to have fitted, `published.py`)."""
    return peak + sum(margin_parts(gpu, layout, peak, allocator).values()) <= gpu.memory


def usable(gpu, layout, peak):
    """Bytes left for the counted peak: the GPU's memory less the fixed parts of the margin, over
    1 + ALLOCATOR (the part that grows with the peak)."""
    fixed = DRIVER_SHARE * gpu.memory + CUDA_CONTEXT + nccl_bytes(layout)
    return (gpu.memory - fixed) / (1 + ALLOCATOR)
