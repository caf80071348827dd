"""Dropout under tensor parallelism: which random numbers must agree across the tensor-parallel
ranks and which must differ (lesson 04, `lessons/04_tensor_parallel.ipynb`, "What real models
need"). After Megatron-LM's `CudaRNGStatesTracker` (megatron/core/tensor_parallel/random.py),
here for the CPU generator.

    where the dropout is                       its input on the t ranks        its masks must
    attention probs (a/t heads per rank)        different heads                 differ
    after g: residual dropout, TP alone         the same whole tensor           agree
    residual dropout under sequence parallel    different tokens (T/t each)     differ

Agreeing masks come from the default generator, seeded alike on every rank of the group
(Megatron: `seed`). Differing ones come from a second state seeded `seed + 2718 + tp_rank`
(Megatron's `model_parallel_cuda_manual_seed`), entered with `tracker.fork()` around those
dropouts only; the default stream is left exactly where it was.
"""

import contextlib

import torch
import torch.distributed as dist


def tensor_parallel_seed(seed, tp_rank):
    """Megatron's seed of the tensor-parallel stream: different on every rank of the group."""
    return seed + 2718 + tp_rank


class RNGTracker:
    """Named generator states beside the default one; `fork(name)` runs a block on one of them.
    The tracker is per model and passed in (no global tracker, unlike Megatron's)."""

    def __init__(self):
        self.states = {}

    def add(self, name, seed):
        if name in self.states:
            raise ValueError(f"RNGTracker: a state named {name!r} exists already")
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states[name] = torch.get_rng_state()
        torch.set_rng_state(saved)  # adding a state leaves the default stream untouched

    @contextlib.contextmanager
    def fork(self, name="tensor-parallel"):
        """Draw from `name`'s stream inside the block; the default stream resumes after it."""
        if name not in self.states:
            raise ValueError(f"RNGTracker: no state {name!r}; add it first (have {sorted(self.states)})")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()  # the next fork continues this stream
            torch.set_rng_state(saved)


def seed_tensor_parallel(seed, group):
    """Seed the default stream alike on every rank (agreeing masks) and return a tracker whose
    "tensor-parallel" stream differs per rank of `group` (differing masks)."""
    torch.manual_seed(seed)
    tracker = RNGTracker()
    tracker.add("tensor-parallel", tensor_parallel_seed(seed, dist.get_rank(group)))
    return tracker
