"""The same tensor parallelism with torch's DTensor (lesson 04, `lessons/04_tensor_parallel.ipynb`):
a `DeviceMesh` over the group's ranks and a plan, from module path to parallel style, handed to
`parallelize_module`; the loss under `loss_parallel`, which never gathers the logits.

    mesh = init_device_mesh("cpu", (tp,))
    model = parallelize_dtensor(GPT(config), mesh, sequence_parallel=False)
    with loss_parallel():
        loss = lm_loss(model(x), y)     # logits: a DTensor sharded by vocabulary
        loss.backward()

Two things the plain course GPT needs first, both done here without touching its code:
- the fused qkv weight's rows are reordered so that DTensor's contiguous Shard(0) hands rank r
  [q_r; k_r; v_r] (`layers.shard` with parts=3), and attention runs a/t heads
  (`TensorParallelAttention`);
- the tied output layer is tied again to the embedding's DTensor after parallelizing.
"""

import copy

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               PrepareModuleOutput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)

from dlcourse.parallel.tensor.layers import shard, unshard
from dlcourse.parallel.tensor.parallelize import TensorParallelAttention, check_tp

__all__ = ["dtensor_plan", "parallelize_dtensor", "dtensor_full_parameters", "loss_parallel"]


def dtensor_plan(n_layers, sequence_parallel=False):
    """{module path: ParallelStyle} for the course GPT (torchtitan's layout for Llama, adapted).
    Without sequence parallelism the residual stream is Replicate()d; with it, Shard(1)."""
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual,
                                   use_local_output=not sequence_parallel),
        "lm_head": ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1),
                                   use_local_output=False),  # logits stay a DTensor for the loss
    }
    if sequence_parallel:
        plan["pos_emb"] = PrepareModuleOutput(output_layouts=Replicate(),
                                              desired_output_layouts=Replicate(),
                                              use_local_output=False)
        plan["ln_f"] = SequenceParallel()
    for i in range(n_layers):
        block = {"attn.qkv": ColwiseParallel(), "mlp.fc": ColwiseParallel(),
                 "attn.proj": RowwiseParallel(output_layouts=residual,
                                              use_local_output=not sequence_parallel),
                 "mlp.proj": RowwiseParallel(output_layouts=residual,
                                             use_local_output=not sequence_parallel)}
        if sequence_parallel:
            gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
            block |= {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                      "attn": PrepareModuleInput(**gather), "mlp": PrepareModuleInput(**gather)}
        plan |= {f"blocks.{i}.{path}": style for path, style in block.items()}
    return plan


def parallelize_dtensor(model, mesh, sequence_parallel=False):
    """A tensor-parallel copy of the plain `GPT` with DTensor parameters on the 1-D `mesh`."""
    t = mesh.size()
    check_tp(model.config, t, sequence_parallel)
    model = copy.deepcopy(model)
    for block in model.blocks:
        qkv = block.attn.qkv
        with torch.no_grad():  # rows ordered [q_0; k_0; v_0; q_1; ...]: Shard(0) cuts it per rank
            qkv.weight.copy_(torch.cat([shard(qkv.weight, 0, r, t, 3) for r in range(t)]))
            if qkv.bias is not None:
                qkv.bias.copy_(torch.cat([shard(qkv.bias, 0, r, t, 3) for r in range(t)]))
        block.attn = TensorParallelAttention(block.attn, t)
    parallelize_module(model, mesh, dtensor_plan(model.config.n_layers, sequence_parallel))
    if model.config.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight  # both Shard(0) over the vocabulary
    return model


def dtensor_full_parameters(model):
    """{name: whole tensor} of a `parallelize_dtensor` model, qkv rows back in q, k, v order."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        full = full.detach().clone()
        if ".attn.qkv." in name:
            t = p.device_mesh.size()
            full = unshard(list(full.chunk(t, dim=0)), 0, parts=3)
        out[name] = full
    return out
