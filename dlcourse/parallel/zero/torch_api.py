"""ZeRO the torch way, beside the from-scratch stages (lesson 05: `lessons/05_zero.ipynb`).

    model, optimizer = zero_redundancy(GPT(config), group, lr=1e-3)    # stage 1
    model, optimizer = fsdp2(GPT(config), group, lr=1e-3)              # stage 3, torch's default
    model, optimizer = fsdp2(..., reshard_after_forward=True)          # the root resharded too
    model, optimizer = fsdp2(..., reshard_after_forward=False)         # ~ stage 2
    model, optimizer = fsdp2(..., mixed_precision=torch.bfloat16, offload=True)

`ZeroRedundancyOptimizer` shards only the optimizer state and leaves the gradient average to
DDP; it hands out whole parameters, greedily, so the ranks hold uneven state (`state_bytes`).
FSDP2's `fully_shard` turns each parameter into a DTensor sharded on dim 0 over a device mesh;
applied to each Block, then to the root, every Block becomes a unit gathered around its forward
and backward, as in `ZeroStage3`. `reshard_after_forward=None` is torch's default (2.13.0,
`_fully_shard.py` and `FSDPState._lazy_init`): True for every Block, False for the root, which
backward needs at once, so the root is gathered once per step, as `ZeroStage3` does. Both
return (model, optimizer) for the same training loop.
"""

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from dlcourse.memory import MemoryParts
from dlcourse.memory.measure import storage_bytes
from dlcourse.models import Block


def zero_redundancy(model, group, lr=1e-3, **adamw_kwargs):
    """Stage 1 with torch: DDP all-reduces the gradients, `ZeroRedundancyOptimizer` steps the
    parameters this rank owns with AdamW and broadcasts them to the others."""
    ddp = DistributedDataParallel(model, process_group=group)
    optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                        process_group=group, lr=lr, **adamw_kwargs)
    return ddp, optimizer


def fsdp2(model, group, lr=1e-3, reshard_after_forward=None, mixed_precision=None,
          offload=False, unit_types=(Block,), **adamw_kwargs):
    """FSDP2 over `group`: `fully_shard` on every unit (a Block), then on the whole model.

    reshard_after_forward: passed to every `fully_shard`. None (torch's default) frees the
    Blocks after forward and keeps the root gathered into backward: 3Ψ - Ψ_root per step. True
    frees the root too and gathers it again for backward: the full 3Ψ. False keeps every unit
    gathered from forward to backward: 2Ψ.
    mixed_precision: a dtype (torch.bfloat16) for the gathered parameters and the gradient
    reduce-scatter; the sharded parameters and AdamW stay fp32 (torch's MixedPrecisionPolicy).
    offload: sharded parameters, gradients and AdamW on the CPU (CPUOffloadPolicy). Pinned
    memory needs a GPU; on a CPU-only machine pin_memory=False is required."""
    device_type = next(model.parameters()).device.type
    mesh = DeviceMesh.from_group(group, device_type)
    options = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision is not None:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed_precision,
                                                    reduce_dtype=mixed_precision)
    if offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for module in [m for m in model.modules() if isinstance(m, unit_types)]:
        fully_shard(module, **options)
    fully_shard(model, **options)  # the root: embeddings and final norm
    return model, torch.optim.AdamW(model.parameters(), lr=lr, **adamw_kwargs)


def local(t):
    """The part of a tensor this rank holds: a DTensor's local shard, else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def fsdp2_held_bytes(model, optimizer):
    """Model-state bytes of an FSDP2 model on this rank, from the local shards' storages."""
    params = list(model.parameters())
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return MemoryParts(params=storage_bytes(local(p) for p in params),
                       grads=storage_bytes(local(p.grad) for p in params if p.grad is not None),
                       optimizer=storage_bytes(local(t) for t in state))


def fsdp2_unsharded_grad_bytes(model):
    """Bytes of full (unsharded) gradients FSDP2 keeps between micro-batches after
    `set_requires_gradient_sync(False)`: it skips the reduce-scatter and accumulates whole
    gradients until a backward with sync (torch 2.13.0, `FSDPParam._unsharded_param.grad` and
    `unsharded_accumulated_grad`; internal names, read only)."""
    grads = []
    for module in model.modules():
        if hasattr(module, "_get_fsdp_state"):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    grads += [fsdp_param._unsharded_param.grad,
                              fsdp_param.unsharded_accumulated_grad]
    return storage_bytes(g for g in grads if g is not None)


def fsdp2_full_parameters(model):
    """name -> the full parameter, gathered from the shards (call on every rank)."""
    return {n: p.full_tensor().detach().clone() if isinstance(p, DTensor) else p.detach().clone()
            for n, p in model.named_parameters()}


def zero_redundancy_state_bytes(optimizer):
    """Bytes of AdamW state this rank's `ZeroRedundancyOptimizer` holds (its own parameters)."""
    return storage_bytes(t for s in optimizer.optim.state.values() for t in s.values()
                         if torch.is_tensor(t) and t.dim() > 0)


def unwrap(model):
    """The plain module inside DDP (FSDP2 changes the module's class in place instead)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


