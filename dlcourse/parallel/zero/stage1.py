"""ZeRO stage 1 (P_os): the optimizer state partitioned (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage1(GPT(config), group)       # a wrapper module, as lesson 03's DataParallel
    optimizer = ZeroAdamW(model, lr=1e-3)        # this rank's shards only (optim.py)
    train_step(model, optimizer, [(x, y)], lm_loss)   # lesson 03's training loop, unchanged

Every rank keeps the whole model and the whole gradient, laid out in flat buffers (one per
lesson 03 bucket, padded to a multiple of N; `shards.FlatShard`). Backward is plain local
backward. The optimizer step then
  1. reduce-scatters each flat gradient: rank r receives the average of its s values only,
  2. runs AdamW on its s values of the parameters, so it keeps Adam state for Ψ/N values,
  3. all-gathers the updated shards: every rank has the whole updated model again.
A reduce-scatter plus an all-gather move what one all-reduce moves, 2Ψ per rank: stage 1 saves
memory for free. Stage 2 (stage2.py) keeps only the gradient shard; stage 3 the parameter shard.
"""

import torch
import torch.distributed as dist
from torch import nn

from dlcourse.parallel.data.buckets import make_buckets
from dlcourse.parallel.data.steps import broadcast_parameters, check_same_model
from dlcourse.parallel.zero.shards import FlatShard


def reduce_scatter_flat(unit, flat, group, async_op=False):
    """Sum a unit's padded flat gradient (padded,) over the ranks; this rank receives its own
    s summed values in a new tensor (s,). Returns (tensor, Work or None): divide by N once done."""
    out = torch.empty(unit.shard_numel, dtype=flat.dtype, device=flat.device)
    work = dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.SUM, group=group,
                                      async_op=async_op)
    return out, work


def add_shard_gradient(shard, summed, world_size):
    """shard.grad += summed / N: the average over the ranks (accumulates over micro-batches)."""
    summed /= world_size
    if shard.grad is None:
        shard.grad = summed
    else:
        shard.grad += summed


class FlatParameters(nn.Module):
    """What stages 1 and 2 share: the module's parameters moved into padded flat buffers (one
    per bucket of `make_buckets`, the order backward finishes them), each parameter a view."""

    stage = None

    def __init__(self, module, group, bucket_cap_mb=25.0):
        super().__init__()
        self.module, self.group = module, group
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        check_same_model(module, group)
        broadcast_parameters(module, group)  # every rank starts from rank 0's weights
        self.units = [FlatShard(b.names, b.params, self.world_size, self.rank)
                      for b in make_buckets(module, bucket_cap_mb)]
        self.flat_params = [self._flatten(u) for u in self.units]  # each (padded,)
        self._shards = [u.my_shard(f) for u, f in zip(self.units, self.flat_params)]  # views (s,)

    def _flatten(self, unit):
        flat = unit.flatten([p.detach() for p in unit.params])
        for p, view in zip(unit.params, unit.views(flat)):
            p.data = view  # the parameter now lives inside the flat buffer
        return flat

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def shards(self):
        """The tensors the optimizer updates: this rank's s values of every unit."""
        return self._shards

    def gather_parameters(self):
        """After the step: every rank's updated shard to every rank (one all-gather per unit)."""
        for shard, flat in zip(self._shards, self.flat_params):
            dist.all_gather_single(flat, shard.clone(), group=self.group)  # input apart from output

    def full_parameters(self):
        """name -> the full parameter (all ranks hold it whole in stages 1 and 2)."""
        return dict(self.module.named_parameters())


class ZeroStage1(FlatParameters):
    """ZeRO stage 1 over `group`: whole parameters and gradients, Adam state for Ψ/N values.

    The gradients accumulate into one flat buffer per unit (`flat_grads`, each parameter's
    .grad a view of it), so the reduce-scatter needs no packing and zero_grad is one fill."""

    stage = 1

    def __init__(self, module, group, bucket_cap_mb=25.0):
        super().__init__(module, group, bucket_cap_mb)
        self.flat_grads = [torch.zeros_like(f) for f in self.flat_params]
        for unit, flat in zip(self.units, self.flat_grads):
            for p, view in zip(unit.params, unit.views(flat)):
                p.grad = view  # autograd adds into an existing .grad in place

    def reduce_gradients(self):
        """Before the step: rank r gets the average gradient of its shard of every unit."""
        for unit, flat, shard in zip(self.units, self.flat_grads, self._shards):
            summed, _ = reduce_scatter_flat(unit, flat, self.group)
            add_shard_gradient(shard, summed, self.world_size)

    def gather_parameters(self):
        super().gather_parameters()
        for shard in self._shards:
            shard.grad = None  # spent: stage 1 keeps the full gradients, not a second copy

    def zero_grad(self, set_to_none=True):
        for flat in self.flat_grads:
            flat.zero_()  # the views stay .grad: set_to_none does not apply to a flat buffer
        for shard in self._shards:
            shard.grad = None  # a shard's gradient lives only from reduce_gradients to the step
