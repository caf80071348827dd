"""Lesson 04's check of vocab_parallel_cross_entropy
(`dlcourse/checks/tensor/vocab_parallel_cross_entropy.py`): the solutions and correct answers
written other ways pass; the wrong answers students write fail with a message naming the case, the
rank and a hint that says which mistake it was. Every run draws new cases, so each wrong answer here
fails on whatever is drawn."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F

from dlcourse.checks.tensor import check_vocab_parallel_cross_entropy
from tensor_checking import _tp, expect_failure
from test_checks_megatron_f_g import MegatronG


# --- exercise 6: vocabulary-parallel cross-entropy --------------------------------------------

def _target_logit(z, targets, group):
    """(N,) z[target] on the rank holding the target, 0 elsewhere."""
    t, r = _tp(group)
    n = z.size(-1)
    mine = (targets >= r * n) & (targets < (r + 1) * n)
    local = (targets - r * n).clamp(0, n - 1)
    return z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine


def _global_max(logits, group):
    m = logits.detach().max(dim=-1).values  # (N,)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    return m


def vocab_parallel_cross_entropy(logits, targets, group):  # composed with g
    z = logits - _global_max(logits, group).unsqueeze(-1)
    sum_exp = MegatronG.apply(z.exp().sum(dim=-1), group)
    z_target = MegatronG.apply(_target_logit(z, targets, group), group)
    return (sum_exp.log() - z_target).mean()


class VocabCrossEntropy(torch.autograd.Function):  # Megatron's way: backward by hand
    @staticmethod
    def forward(ctx, logits, targets, group):
        z = logits - _global_max(logits, group).unsqueeze(-1)
        sum_exp, z_target = z.exp().sum(dim=-1), _target_logit(z, targets, group)
        both = torch.stack([sum_exp, z_target])  # (2, N): one all-reduce
        dist.all_reduce(both, group=group)
        t, r = _tp(group)
        n = logits.size(-1)
        onehot = F.one_hot(targets, t * n)[:, r * n:(r + 1) * n].to(logits.dtype)
        ctx.save_for_backward(z.exp() / both[0].unsqueeze(-1) - onehot)
        return (both[0].log() - both[1]).mean()

    @staticmethod
    def backward(ctx, grad):
        (softmax_minus_onehot,) = ctx.saved_tensors
        return softmax_minus_onehot * grad / softmax_minus_onehot.size(0), None, None


def loss_by_hand(logits, targets, group):
    return VocabCrossEntropy.apply(logits, targets, group)


def loss_gathers_the_logits(logits, targets, group):
    whole = torch.cat(dist_nn.all_gather(logits, group=group), dim=-1)  # (N, V)
    return F.cross_entropy(whole, targets)


def loss_gathers_then_keeps_own(logits, targets, group):  # the values and own gradient right
    t, r = _tp(group)
    pieces = [torch.empty_like(logits) for _ in range(t)]
    dist.all_gather(pieces, logits.detach().contiguous(), group=group)
    pieces[r] = logits
    return F.cross_entropy(torch.cat(pieces, dim=-1), targets)


def loss_gathers_row_by_row(logits, targets, group):  # each gather smaller than the logits
    t, r = _tp(group)
    losses = []
    for row, target in zip(logits, targets):
        pieces = [torch.empty_like(row) for _ in range(t)]
        dist.all_gather(pieces, row.detach().contiguous(), group=group)
        pieces[r] = row
        losses.append(F.cross_entropy(torch.cat(pieces)[None], target[None]))
    return torch.stack(losses).mean()


def loss_with_torch_all_reduce(logits, targets, group):  # the g trap
    z = logits - _global_max(logits, group).unsqueeze(-1)
    sum_exp = dist_nn.all_reduce(z.exp().sum(dim=-1), group=group)
    z_target = dist_nn.all_reduce(_target_logit(z, targets, group), group=group)
    return (sum_exp.log() - z_target).mean()


def loss_without_max(logits, targets, group):
    sum_exp = MegatronG.apply(logits.exp().sum(dim=-1), group)
    return (sum_exp.log() - MegatronG.apply(_target_logit(logits, targets, group), group)).mean()


def loss_local_max(logits, targets, group):
    z = logits - logits.detach().max(dim=-1, keepdim=True).values
    sum_exp = MegatronG.apply(z.exp().sum(dim=-1), group)
    return (sum_exp.log() - MegatronG.apply(_target_logit(z, targets, group), group)).mean()


def loss_not_differentiable(logits, targets, group):
    with torch.no_grad():
        return vocab_parallel_cross_entropy(logits, targets, group)


def loss_from_the_library(logits, targets, group):
    from dlcourse.parallel.tensor import vocab_parallel_cross_entropy as library_loss
    return library_loss(logits, targets, group)


def loss_from_dtensor(logits, targets, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    mesh = DeviceMesh("cpu", list(range(dist.get_world_size(group))))
    with loss_parallel():
        return F.cross_entropy(DTensor.from_local(logits, mesh, [Shard(1)]), targets)


@pytest.mark.parametrize("answer", [vocab_parallel_cross_entropy, loss_by_hand])
def test_vocab_parallel_cross_entropy_passes_correct_answers(answer, capsys):
    check_vocab_parallel_cross_entropy(answer)
    assert "vocab_parallel_cross_entropy: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (loss_gathers_the_logits, "rank ? moved", "a few numbers per token"),
    (loss_gathers_then_keeps_own, "rank ? moved", "a few numbers per token"),
    (loss_gathers_row_by_row, "rank ? moved", "a few numbers per token"),
    (loss_with_torch_all_reduce, "rank ? returned wrong values", "times too large"),
    (loss_without_max, ("rank ? returned wrong values", "rank ? raised"), ""),
    (loss_local_max, "rank ? returned wrong values", ""),
    (loss_not_differentiable, "rank ? the loss does not require grad", ""),
    (loss_from_the_library, "rank ? called vocab_parallel_cross_entropy from", ""),
    (loss_from_dtensor, "rank ? called torch's loss_parallel", ""),
])
def test_vocab_parallel_cross_entropy_fails_wrong_answers(answer, says, hint):
    expect_failure(check_vocab_parallel_cross_entropy, answer, "vocab_parallel_cross_entropy",
                   says, hint)
