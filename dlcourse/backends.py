"""Which backend a job of N ranks gets, and what this machine offers (`dlcourse info`)."""

import os
import re
from datetime import timedelta

import torch
import torch.distributed as dist

NAMES = ("auto", "gloo", "nccl")

# The torch releases CI runs the course on (.ci/run): the whole test suite on the first, the pin
# in constraints.txt, and the tour and every lesson on the second, the newest on PyPI when this was
# last raised (.ci/newest-torch says when PyPI has a newer one). pyproject.toml accepts the first
# and anything newer; the README names both.
TESTED_TORCH = ("2.13.0", "2.15.0")


def cpu_cores():
    """Cores this process may use (a container or `taskset` can allow fewer than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def gpu_count():
    # device_count() asks NVML and does not initialise CUDA in this process.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose(backend, world_size):
    """Return (backend, reason). The reason is empty when the caller named the backend."""
    gpus = gpu_count()
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ValueError("backend='nccl' is not in this torch build (a CPU build has only "
                             "gloo); use backend='gloo' or 'auto'")
        if gpus < world_size:
            raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} "
                             f"but {gpus} GPU(s) visible. Use world_size<={gpus} or "
                             "backend='gloo' (CPU) or 'auto'")
        return "nccl", ""
    if backend == "gloo":
        return "gloo", ""
    if gpus >= world_size and dist.is_nccl_available():
        return "nccl", f"{gpus} GPU(s): one per rank"
    if gpus == 0:
        return "gloo", "no GPU: gloo runs on CPU"
    return "gloo", f"{gpus} GPU(s) for {world_size} ranks: nccl needs one per rank, gloo runs on CPU"


def in_launched_rank():
    """True inside torchrun (or a rank of dlcourse.launch): RANK and WORLD_SIZE are set."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def timedelta_s(seconds):
    return timedelta(seconds=seconds)


def _release(version):
    """'2.15.0+cu132' -> (2, 15, 0); None for a pre-release or a nightly ('2.16.0.dev20261101')."""
    found = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(\+.*)?", version)
    return tuple(int(n) for n in found.groups()[:3]) if found else None


def tested_range(version):
    """Where a torch version stands against TESTED_TORCH, in the words `dlcourse info` prints."""
    low, high = TESTED_TORCH
    span = f"the tested range {low} to {high}"
    release = _release(version)
    if release is None:
        return f"not a release: outside {span}"
    if release < _release(low):
        return f"older than {span}: the course needs {low} or newer (pip install -U torch)"
    if release > _release(high):
        return f"newer than {span}: CI has not run the course on it"
    return f"within {span}"


def describe():
    """The facts `dlcourse info` prints, as (name, value) rows."""
    names = [torch.cuda.get_device_name(i) for i in range(gpu_count())]
    rows = [
        ("torch", f"{torch.__version__} ({tested_range(torch.__version__)})"),
        ("backends", ", ".join(b for b in ("gloo", "nccl", "mpi", "ucc")
                               if getattr(dist, f"is_{b}_available", lambda: False)())),
        ("GPUs", f"{len(names)}" + (f" ({', '.join(names)})" if names else "")),
        ("CPU cores", str(cpu_cores())),
    ]
    for n in (1, 2, 4, 8):
        backend, why = choose("auto", n)
        threads = max(1, cpu_cores() // n)
        rows.append((f"auto, {n} rank{'s' if n > 1 else ''}",
                     f"{backend} ({why}), {threads} torch thread{'s' if threads > 1 else ''} per rank"))
    return rows
