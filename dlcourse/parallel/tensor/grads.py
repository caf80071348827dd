"""One all-reduce for all the partial gradients of sequence parallelism (lesson 04,
`lessons/04_tensor_parallel.ipynb`, "What real models need").

Under sequence parallelism every whole parameter that sees only this rank's T/t tokens (the
LayerNorms' weights and biases, the row-parallel biases, the position embeddings) ends backward
with a partial gradient. `f` sums each in backward: one small all-reduce per parameter, 15 for the
course GPT, each paying a collective's latency. Megatron-LM instead leaves them partial and, after
backward, flattens them into one buffer and all-reduces it once over the tensor-parallel group
(`_allreduce_layernorm_grads`, later `_allreduce_non_tensor_model_parallel_grads`, which coalesce
the grads of parameters marked `sequence_parallel`).

    model = parallelize(GPT(config), group, sequence_parallel=True, sum_grads=False)
    loss.backward(); all_reduce_sequence_partial_grads(model, group); optimizer.step()
"""

import torch
import torch.distributed as dist


def all_reduce_sequence_partial_grads(model, group):
    """Sum over `group` the gradients of every parameter marked `sequence_partial`, in one
    all-reduce of their concatenation; returns how many gradients it summed."""
    grads = [p.grad for p in model.parameters()
             if getattr(p, "sequence_partial", False) and p.grad is not None]
    if not grads:
        return 0
    flat = torch.cat([grad.reshape(-1) for grad in grads])  # (sum of their sizes,)
    dist.all_reduce(flat, group=group)
    for grad, summed in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(summed.view_as(grad))
    return len(grads)
