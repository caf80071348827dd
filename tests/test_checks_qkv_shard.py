"""Lesson 04's check of qkv_shard (`dlcourse/checks/tensor/qkv_shard.py`): the solutions and
correct answers written other ways pass; the wrong answers students write fail with a message
naming the case, the rank and a hint that says which mistake it was. Every run draws new cases,
so each wrong answer here fails on whatever is drawn."""

import pytest
import torch

from dlcourse.checks.tensor import check_qkv_shard
from tensor_checking import _tp, expect_failure


# --- exercise 5: the fused qkv ----------------------------------------------------------------

def qkv_shard(qkv, group):
    t, r = _tp(group)
    w = torch.cat([part.chunk(t, dim=0)[r] for part in qkv.weight.chunk(3, dim=0)])
    b = None if qkv.bias is None else torch.cat([p.chunk(t)[r] for p in qkv.bias.chunk(3)])
    return w, b


def qkv_by_view(qkv, group):  # (3h, h) seen as (q/k/v, rank, h/t, h)
    t, r = _tp(group)
    h = qkv.in_features
    w = qkv.weight.view(3, t, h // t, h)[:, r].reshape(-1, h)
    b = None if qkv.bias is None else qkv.bias.view(3, t, -1)[:, r].reshape(-1)
    return w, b


def qkv_contiguous_chunks(qkv, group):
    t, r = _tp(group)
    return qkv.weight.chunk(t)[r], None if qkv.bias is None else qkv.bias.chunk(t)[r]


def qkv_wrong_dim(qkv, group):
    t, r = _tp(group)
    w = torch.cat([part.chunk(t, dim=1)[r] for part in qkv.weight.chunk(3, dim=0)])
    return w, None if qkv.bias is None else qkv.bias


def qkv_bias_contiguous(qkv, group):
    t, r = _tp(group)
    w, _ = qkv_shard(qkv, group)
    return w, None if qkv.bias is None else qkv.bias.chunk(t)[r]


def qkv_tp4_only(qkv, group):
    _, r = _tp(group)
    h = qkv.in_features
    w = qkv.weight.view(3, 4, -1, h)[:, r].reshape(-1, h)
    b = None if qkv.bias is None else qkv.bias.view(3, 4, -1)[:, r].reshape(-1)
    return w, b


def qkv_from_the_library(qkv, group):
    from dlcourse.parallel.tensor.layers import shard
    t, r = _tp(group)
    return shard(qkv.weight, 0, r, t, parts=3), None


def qkv_patching_the_checks_helper(qkv, group):
    """Wrong rows (contiguous blocks), and the check's helper rebound in the rank to give the
    right term of the attention whatever the rows: issue 28's escape."""
    import dlcourse.checks.tensor.qkv_shard as qkv_checks

    def heads(attn, w, b, x, rank, tp):  # this rank's share of the whole attention
        y = attn(x).detach()
        return (y if attn.proj.bias is None else y - attn.proj.bias.detach()) / tp

    qkv_checks._heads = heads
    return qkv_contiguous_chunks(qkv, group)


@pytest.mark.parametrize("answer", [qkv_shard, qkv_by_view])
def test_qkv_shard_passes_correct_answers(answer, capsys):
    check_qkv_shard(answer)
    assert "qkv_shard: passed on 3 cases drawn afresh" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (qkv_contiguous_chunks, "rank ? returned wrong values", "contiguous blocks of rows"),
    (qkv_patching_the_checks_helper, "rank ? returned wrong values", "contiguous blocks of rows"),
    (qkv_wrong_dim, "rank ? returned a weight of", "cuts the weight's columns"),
    (qkv_bias_contiguous, "rank ? returned wrong values", "bias was cut"),
    (qkv_tp4_only, ("rank ? raised", "rank ? returned"), ""),
    (qkv_from_the_library, "rank ? called shard from dlcourse.parallel.tensor.layers", ""),
])
def test_qkv_shard_fails_wrong_answers(answer, says, hint):
    expect_failure(check_qkv_shard, answer, "qkv_shard", says, hint)
