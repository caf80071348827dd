"""Data parallelism from scratch (lesson 03: `lessons/03_data_parallel.ipynb`).

Every rank holds the whole model and trains on its own shard of the batch. After backward each
rank has the gradient of its shard's loss; averaging those gradients over the ranks gives the
gradient of the whole batch's loss, so one optimizer step keeps every replica identical.

The lesson builds it in three steps, each a piece here:
  1. `average_gradients(model, group)`: after backward, one all-reduce per gradient.
  2. `make_buckets` + `all_reduce_buckets` (buckets.py): a few big all-reduces instead.
  3. `DataParallel(model, group)` (overlap.py): buckets all-reduced from gradient hooks while
     backward is still running, and `no_sync()` for gradient accumulation, like torch's
     `DistributedDataParallel`, so one training loop (`train_step`) runs with either.
The model stays plain PyTorch; the process group is always passed in.
"""

import contextlib

import torch
import torch.distributed as dist


def shard_batch(batch, group, allow_uneven=False):
    """This rank's contiguous slice of a global batch: a tensor or a tuple of tensors, split on
    dim 0 in rank order. Uneven splits (10 samples on 4 ranks: 3, 3, 2, 2) need
    `allow_uneven=True` and `uneven_loss_scale`, or the averaged gradient is wrong."""
    tensors = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    n, world_size = tensors[0].size(0), dist.get_world_size(group)
    if n < world_size:
        raise ValueError(f"a global batch of {n} samples cannot give each of {world_size} "
                         f"ranks a sample; use at least {world_size} samples")
    if n % world_size and not allow_uneven:
        lower = n - n % world_size
        raise ValueError(
            f"a global batch of {n} samples does not split evenly over {world_size} ranks "
            f"({n} / {world_size} = {n / world_size:g}). Use a multiple of {world_size} (e.g. "
            f"{lower} or {lower + world_size}), or pass allow_uneven=True and multiply each "
            "rank's loss by uneven_loss_scale(local_batch, group)"
        )
    rank = dist.get_rank(group)
    shards = tuple(t.tensor_split(world_size)[rank] for t in tensors)  # sizes differ by <= 1
    return shards if isinstance(batch, (tuple, list)) else shards[0]


def uneven_loss_scale(local_batch, group):
    """world_size * local_batch / global_batch: multiply this rank's mean loss by it when ranks
    hold different numbers of samples.

    Averaging gradients weighs every rank equally: (1/W) sum_r g_r. The whole batch's gradient
    weighs every sample equally: sum_r (n_r / N) g_r. Scaling rank r's loss by W n_r / N turns
    the first into the second. It is 1 when every rank holds N / W samples.
    """
    total = torch.tensor([float(local_batch)])
    dist.all_reduce(total, group=group)  # N = sum of the local batch sizes
    return dist.get_world_size(group) * local_batch / total.item()


def broadcast_parameters(model, group):
    """Copy the parameters and buffers of the group's first rank to all the others, so every
    replica starts from the same weights (DDP does this when it wraps a model)."""
    src = dist.get_global_rank(group, 0)  # broadcast names the source by its global rank
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=src, group=group)


def check_same_model(model, group):
    """Fail clearly, before any broadcast, if the ranks hold models of different sizes."""
    params = list(model.parameters())
    mine = torch.tensor([len(params), sum(p.numel() for p in params)])  # (tensors, values)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    for rank, theirs in enumerate(everyone):
        if not torch.equal(theirs, everyone[0]):
            raise ValueError(
                f"rank {rank} of the group has {theirs[1]:,} parameter values in {theirs[0]} "
                f"tensors but rank 0 has {everyone[0][1]:,} in {everyone[0][0]}: data "
                "parallelism needs the same model on every rank (same config on each)"
            )


def average_gradients(model, group):
    """Step 1, naive data parallelism: after `loss.backward()`, replace every gradient by its
    average over the ranks of `group`, one all-reduce per parameter tensor."""
    world_size = dist.get_world_size(group)
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            raise RuntimeError(
                f"parameter {name} has no gradient on this rank, so this rank would skip an "
                "all-reduce the others make. Use DataParallel(..., find_unused_parameters=True)"
            )
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)  # sum over the ranks
        p.grad /= world_size  # ... then the mean


def train_step(model, optimizer, micro_batches, loss_fn, loss_scale=1.0):
    """One optimizer step over a list of (inputs, targets) micro-batches; returns the mean loss.

    Gradients of all but the last micro-batch accumulate locally inside `model.no_sync()`; the
    last backward averages the accumulated sum over the ranks, once. Each micro-batch's loss is
    weighted by its share of the samples, so the step equals one step on all of them together.
    Runs unchanged with `DataParallel`, torch's `DistributedDataParallel`, or (one micro-batch)
    a plain model. `loss_scale`: see `uneven_loss_scale`.
    """
    optimizer.zero_grad()
    n_samples = sum(x.size(0) for x, _ in micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else _no_sync(model):
            loss = loss_fn(model(x), y) * (x.size(0) / n_samples)
            (loss * loss_scale).backward()
        total += loss.item()
    optimizer.step()
    return total


def _no_sync(model):
    # A plain model has nothing to synchronise: its gradients just accumulate.
    return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
