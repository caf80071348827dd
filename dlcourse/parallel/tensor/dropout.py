"""Dropout in the tensor-parallel GPT, and the one process it must equal (lesson 04,
`lessons/04_tensor_parallel.ipynb`, "What real models need"; lesson 10's finder compares them).

Which random stream each dropout of a block draws from, after Megatron-LM (megatron/core:
`DotProductAttention` drops the attention probabilities inside `get_cuda_rng_tracker().fork()`;
`model_parallel_cuda_manual_seed` keeps the default stream for "dropout in the
non-tensor-model-parallel regions"):

    dropout              its input on rank r of t               stream (`STREAMS`)
    attn.attn_dropout    heads [r a/t, (r+1) a/t) of the probs   "tensor-parallel": seed + 2718 + r
    attn.resid_dropout   the whole (B, T, h), after g            default: seed, alike on every rank
    mlp.dropout          the whole (B, T, h), after g            default

`track_dropout(tp_model, tracker)` puts the table into a TP model (`parallelize(..., tracker=)`).
No plain one-process GPT equals such a run: one process draws every mask from one stream. The one
that does, `one_process_dropout`, is built from the rule above and not from the TP code: the mask
of head group r drawn from the stream rank r seeds (`tensor_parallel_seed`), the groups put side by
side, and every residual mask drawn once from the shared seed.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.parallel.tensor.rng import RNGTracker, tensor_parallel_seed

TENSOR_PARALLEL = "tensor-parallel"  # the tracker's per-rank state (`rng.seed_tensor_parallel`)
# a block's dropout -> the tracker state it draws from; None: the default stream
STREAMS = {"attn.attn_dropout": TENSOR_PARALLEL, "attn.resid_dropout": None, "mlp.dropout": None}


class TrackedDropout(nn.Dropout):
    """nn.Dropout drawing its mask from `tracker`'s state `stream` (None: the default stream)."""

    def __init__(self, p, tracker, stream):
        super().__init__(p)
        self.tracker, self.stream = tracker, stream  # a plain attribute: not a module

    def forward(self, x):
        if self.stream is None:
            return super().forward(x)
        with self.tracker.fork(self.stream):
            return super().forward(x)

    def extra_repr(self):
        return f"p={self.p}, stream={self.stream or 'default'}"


def track_dropout(model, tracker):
    """In place: each block's dropouts in the TP `model` draw from the stream `STREAMS` names."""
    for block in model.blocks:
        for path, stream in STREAMS.items():
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            setattr(parent, name, TrackedDropout(getattr(parent, name).p, tracker, stream))
    return model


class ConstructedDropout(nn.Module):
    """Dropout with a mask put together from pieces: x cut into len(streams) equal pieces on
    `dim`, piece i's mask drawn from `tracker`'s state streams[i] on a tensor of the piece's shape
    and dtype. Returns x * mask: F.dropout on CPU multiplies its input by bernoulli(1 - p) / (1 - p)
    drawn the same way (torch's `_dropout_impl`, a MulBackward0 in the graph), so a piece equals
    F.dropout of it under that state, bit for bit."""

    def __init__(self, p, tracker, streams, dim):
        super().__init__()
        self.p, self.tracker, self.streams, self.dim = p, tracker, list(streams), dim

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        shape = list(x.shape)
        shape[self.dim] //= len(self.streams)  # (B, a/t, T, T) for rank r's heads
        masks = []
        for stream in self.streams:
            with self.tracker.fork(stream):
                masks.append(F.dropout(torch.ones(shape, dtype=x.dtype, device=x.device), self.p))
        return x * torch.cat(masks, dim=self.dim)

    def extra_repr(self):
        return f"p={self.p}, streams={self.streams}, dim={self.dim}"


def one_process_dropout(model, tp, seed):
    """In place: the plain GPT's dropouts draw the masks that `tp` ranks of `track_dropout`,
    seeded by `rng.seed_tensor_parallel(seed, group)`, draw between them. Each state is
    this model's own (an `RNGTracker`), so the process's default stream is not touched."""
    tracker = RNGTracker()
    tracker.add("shared", seed)  # what torch.manual_seed(seed) gives every tp rank
    ranks = [f"rank {r}" for r in range(tp)]
    for r, name in enumerate(ranks):
        tracker.add(name, tensor_parallel_seed(seed, r))  # rank r's "tensor-parallel" state
    for block in model.blocks:
        p = block.attn.attn_dropout.p
        # probs (B, a, T, T): piece r on dim 1 is rank r's heads, with rank r's stream
        block.attn.attn_dropout = ConstructedDropout(p, tracker, ranks, dim=1)
        # (B, T, h), whole on every tp rank: one mask from the shared stream
        block.attn.resid_dropout = ConstructedDropout(p, tracker, ["shared"], dim=0)
        block.mlp.dropout = ConstructedDropout(p, tracker, ["shared"], dim=0)
    return model
