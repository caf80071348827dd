"""Lesson 04's check of row_parallel_linear (`dlcourse/checks/tensor/row_parallel_linear.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail
with a message naming the case, the rank and a hint that says which mistake it was. Every run
draws new cases, so each wrong answer here fails on whatever is drawn."""

from functools import partial

import pytest
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.tensor import check_row_parallel_linear
from tensor_checking import _tp, expect_failure


# --- exercise 2: row-parallel linear ----------------------------------------------------------

def row_parallel_linear(x, weight, bias, group):
    t, r = _tp(group)
    partial = x.chunk(t, dim=-1)[r] @ weight.T  # (..., out): this rank's term of the sum
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


def row_bias_on_rank0(x, weight, bias, group):  # the bias goes into the sum, from one rank
    _, r = _tp(group)
    n = weight.size(1)
    y = F.linear(x[..., r * n:(r + 1) * n], weight, bias if r == 0 else None)
    dist.all_reduce(y, group=group)
    return y


def row_bias_on_every_rank(x, weight, bias, group):
    t, r = _tp(group)
    y = F.linear(x.chunk(t, dim=-1)[r], weight, bias)
    dist.all_reduce(y, group=group)
    return y


def row_split_wrong_dim(x, weight, bias, group):
    t, r = _tp(group)
    partial = x.chunk(t, dim=0)[r] @ weight.T
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


def row_no_all_reduce(x, weight, bias, group):
    t, r = _tp(group)
    return F.linear(x.chunk(t, dim=-1)[r], weight, bias)


def row_tp4_only(x, weight, bias, group):
    _, r = _tp(group)
    partial = x.chunk(4, dim=-1)[r] @ weight.T
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


@pytest.mark.parametrize("answer", [row_parallel_linear, row_bias_on_rank0])
def test_row_parallel_linear_passes_correct_answers(answer, capsys):
    check_row_parallel_linear(answer)
    assert "row_parallel_linear: passed on 3 cases drawn afresh" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (row_bias_on_every_rank, "rank ? returned wrong values", "the bias was added"),
    (row_split_wrong_dim, ("rank ? raised", "rank ? returned"), ""),
    (row_no_all_reduce, "rank ? returned wrong values", "partial sum"),
    (row_tp4_only, ("rank ? raised", "rank ? returned"), ""),
])
def test_row_parallel_linear_fails_wrong_answers(answer, says, hint):
    expect_failure(check_row_parallel_linear, answer, "row_parallel_linear", says, hint)
