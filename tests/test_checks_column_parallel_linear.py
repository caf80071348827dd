"""Lesson 04's check of column_parallel_linear (`dlcourse/checks/tensor/column_parallel_linear.py`):
the solutions and correct answers written other ways pass; the wrong answers students write fail
with a message naming the case, the rank and a hint that says which mistake it was. Every run draws
new cases, so each wrong answer here fails on whatever is drawn."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.tensor import check_column_parallel_linear
from tensor_checking import expect_failure


# --- exercise 1: column-parallel linear -------------------------------------------------------

def column_parallel_linear(x, weight, bias, group):
    y = F.linear(x, weight, bias)  # (..., out/t)
    pieces = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, y, group=group)
    return torch.cat(pieces, dim=-1)


def column_into_one_buffer(x, weight, bias, group):  # one buffer of rows, rank axis moved
    y = x @ weight.T + (0 if bias is None else bias)
    rows = y.reshape(-1, y.size(-1))  # (M, out/t)
    t = dist.get_world_size(group)
    out = rows.new_empty((t * rows.size(0), rows.size(1)))  # the ranks' rows, stacked
    dist.all_gather_single(out, rows, group=group)
    return out.view(t, *y.shape).movedim(0, -2).reshape(*y.shape[:-1], -1)


def _gathered(x, weight, bias, group, n=None):
    y = F.linear(x, weight, bias)
    pieces = [torch.empty_like(y) for _ in range(n or dist.get_world_size(group))]
    dist.all_gather(pieces, y, group=group)
    return pieces


def column_cat_dim0(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group), dim=0)


def column_no_gather(x, weight, bias, group):
    return F.linear(x, weight, bias)


def column_reversed(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group)[::-1], dim=-1)


def column_no_bias(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, None, group), dim=-1)


def column_tp4_only(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group, n=4), dim=-1)


def column_from_the_library(x, weight, bias, group):
    from dlcourse.parallel.tensor import gather_last_dim
    return gather_last_dim(F.linear(x, weight, bias), group)


@pytest.mark.parametrize("answer", [column_parallel_linear, column_into_one_buffer])
def test_column_parallel_linear_passes_correct_answers(answer, capsys):
    check_column_parallel_linear(answer)
    assert "column_parallel_linear: passed on 3 cases drawn afresh" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (column_cat_dim0, "rank ? returned shape", "along the last dim"),
    (column_no_gather, "rank ? returned shape", "all-gather the blocks"),
    (column_reversed, "rank ? returned wrong values", "wrong order"),
    (column_no_bias, "rank ? returned wrong values", "bias is missing"),
    (column_tp4_only, "rank ? raised", ""),
    (column_from_the_library, "rank ? called gather_last_dim from dlcourse.parallel.tensor", ""),
])
def test_column_parallel_linear_fails_wrong_answers(answer, says, hint):
    expect_failure(check_column_parallel_linear, answer, "column_parallel_linear", says, hint)
