"""Gradient clipping when no rank holds the whole gradient (lesson 05: `lessons/05_zero.ipynb`).

    optimizer = ZeroAdamW(model, lr=1e-3, max_grad_norm=1.0)   # clips before every step

`torch.nn.utils.clip_grad_norm_` scales every gradient by min(1, max_norm / (|g| + 1e-6)), where
|g| is the 2-norm of the whole gradient. Under ZeRO each rank holds only its shard (s values per
unit), so the norm needs one all-reduce of a scalar: every rank adds the squares of its own
shard, the sum over ranks is |g|^2, and every rank then applies the same factor to its shard.
The padding adds nothing: its gradient is zero. Clipping must see the averaged gradient: a
gradient summed over N ranks has N times the norm and would be clipped N times harder.
"""

import torch
import torch.distributed as dist


def global_grad_norm(shards, group):
    """|g|: the 2-norm of the gradient whose shards the ranks hold (one all-reduce of a scalar)."""
    grads = [s.grad for s in shards if s.grad is not None]
    dtype = torch.promote_types(grads[0].dtype, torch.float32) if grads else torch.float32
    squares = torch.zeros((), dtype=dtype)  # the sum of g_i^2 over this rank's shard values
    for g in grads:
        squares += g.to(dtype).square().sum().cpu()
    dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=group)  # sum over ranks: |g|^2
    return squares.sqrt()


@torch.no_grad()
def clip_grad_norm_(shards, max_norm, group):
    """Scale the shards' gradients in place as one process's `clip_grad_norm_` scales the whole
    gradient; returns |g| before clipping (the same on every rank)."""
    norm = global_grad_norm(shards, group)
    coefficient = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # torch's formula, eps included
    for s in shards:
        if s.grad is not None:
            s.grad.mul_(coefficient.to(s.grad.device, s.grad.dtype))
    return norm
