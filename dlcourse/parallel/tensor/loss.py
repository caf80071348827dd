"""Vocabulary-parallel cross-entropy (lesson 04, `lessons/04_tensor_parallel.ipynb`): the loss of
logits split by vocabulary over the tensor-parallel group, without ever gathering them
(Megatron-LM's vocab-parallel cross-entropy, Shoeybi et al. 2019, Section 3).

For one token with logits z (V values, V/t on each rank) and target y:
    loss = log sum_v exp(z_v - m) - (z_y - m),  m = max_v z_v
Each rank computes its part of the max, of the sum of exponentials and of z_y (0 unless y is one
of its ids); three all-reduces of N numbers (N = tokens) finish them: 3N values instead of the
N x V logits. The gradient, softmax(z) - onehot(y), needs no communication at all: each rank
owns its columns.
"""

import torch
import torch.distributed as dist

from dlcourse.parallel.tensor.layers import local_ids


class VocabParallelCrossEntropy(torch.autograd.Function):
    """(N, V/t) logits on each rank, (N,) targets -> the mean loss over the N tokens, the same
    on every rank. Saves this rank's (N, V/t) softmax for backward, 1/t of the full one."""

    @staticmethod
    def forward(ctx, logits, targets, group):
        rank = dist.get_rank(group)
        n_local = logits.size(-1)
        m = logits.max(dim=-1).values  # (N,) this rank's max
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)  # the global max, for stability
        z = logits - m.unsqueeze(-1)  # (N, V/t)
        local, outside = local_ids(targets, rank * n_local, n_local)
        z_target = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(z_target, group=group)  # (N,) z_y - m: only the owner had it
        exp = z.exp_()  # in place: z is ours
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)  # (N,) sum over the whole vocabulary
        softmax = exp.div_(sum_exp.unsqueeze(-1))  # (N, V/t)
        ctx.save_for_backward(softmax, local, outside)
        return (sum_exp.log() - z_target).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        n = softmax.size(0)
        grad_logits = softmax.clone()
        rows = torch.arange(n, device=softmax.device)
        grad_logits[rows, local] -= (~outside).to(softmax.dtype)  # - onehot(y), where y is ours
        return grad_logits * (grad / n), None, None


def vocab_parallel_cross_entropy(logits, targets, group):
    """Mean cross-entropy of (N, V/t) vocabulary-parallel logits against (N,) targets."""
    return VocabParallelCrossEntropy.apply(logits, targets, group)


def vocab_parallel_lm_loss(logits, targets, group):
    """`dlcourse.models.lm_loss` for vocabulary-parallel logits: (B, T, V/t), (B, T) -> ()."""
    return vocab_parallel_cross_entropy(logits.flatten(0, 1), targets.flatten(), group)
