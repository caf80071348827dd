"""Lesson 09, exercise 2 (`dlcourse/checks/expert/load_balance_loss.py`): Switch's load-balance
loss, value and gradient against a float64 reference, 1 at uniform routing. An answer written
another way passes; each wrong one fails with the hint that names it; the lesson's loss is
refused."""

import pytest
import torch

from checking import first_line_and_hint, starts
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.expert import check_load_balance_loss


def load_balance_loss(logits, k):
    probs = torch.softmax(logits, dim=-1)
    N, E = probs.shape
    counts = torch.bincount(probs.topk(k, dim=-1).indices.flatten(), minlength=E)
    f = counts.to(probs.dtype) / (N * k)  # in float64: a count divided in float32 loses digits
    return E * (f * probs.mean(dim=0)).sum()


def loss_by_one_hot(logits, k):  # f from one-hot rows, P as a sum over N, an einsum
    probs = logits.softmax(dim=1)
    N, E = probs.shape
    chosen = torch.nn.functional.one_hot(probs.argsort(dim=1, descending=True)[:, :k], E)
    f = chosen.sum(dim=(0, 1)).double() / chosen.sum()
    return E * torch.einsum("e,e->", f, probs.sum(dim=0) / N)


def without_e(logits, k):
    return load_balance_loss(logits, k) / logits.size(1)


def f_over_tokens(logits, k):  # the shares sum to k
    return load_balance_loss(logits, k) * k


def p_summed(logits, k):
    return load_balance_loss(logits, k) * logits.size(0)


def softmax_over_tokens(logits, k):
    probs = torch.softmax(logits, dim=0)
    N, E = probs.shape
    f = torch.bincount(probs.topk(k, dim=-1).indices.flatten(), minlength=E) / (N * k)
    return E * (f * probs.mean(dim=0)).sum()


def detached(logits, k):
    return load_balance_loss(logits.detach(), k)


def gradient_through_f(logits, k):  # the right value, but f is made to carry a gradient
    probs = torch.softmax(logits, dim=-1)
    N, E = probs.shape
    top, chosen = probs.topk(k, dim=-1)
    ones = top / top.detach()  # 1 in value, d/dp = 1/p
    f = torch.zeros(E, dtype=probs.dtype).index_add(0, chosen.flatten(), ones.flatten()) / (N * k)
    return E * (f * probs.mean(dim=0)).sum()


def f_in_float32(logits, k):  # right but for f's rounding: int / int is float32 in torch
    probs = torch.softmax(logits, dim=-1)
    N, E = probs.shape
    f = torch.bincount(probs.topk(k, dim=-1).indices.flatten(), minlength=E) / (N * k)
    return E * (f * probs.mean(dim=0)).sum()


def with_the_library(logits, k):
    from dlcourse.moe import load_balance_loss as lesson
    probs = torch.softmax(logits, dim=-1)
    counts = torch.bincount(probs.topk(k, dim=-1).indices.flatten(), minlength=logits.size(1))
    return lesson(probs, counts)


@pytest.mark.parametrize("answer", [load_balance_loss, loss_by_one_hot])
def test_load_balance_loss_passes(answer, capsys):
    check_load_balance_loss(answer)
    assert "load_balance_loss: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (without_e, "that is 1/E of it"),
    (f_over_tokens, "k = "),
    (p_summed, "mean probability over the tokens, not the sum"),
    (softmax_over_tokens, "softmax is over the tokens (dim 0)"),
    (detached, "P_e must keep its graph"),
    (gradient_through_f, "carries no gradient"),
    (f_in_float32, "float32"),
])
def test_load_balance_loss_wrong_answers_fail(answer, hint):
    first, got_hint = first_line_and_hint(check_load_balance_loss, answer)
    assert starts(first, "load_balance_loss(logits (") and hint in got_hint, (first, got_hint)


def test_the_lessons_loss_is_refused():
    first, _ = first_line_and_hint(check_load_balance_loss, with_the_library)
    assert "called load_balance_loss from dlcourse.moe, which this exercise does not allow" \
        in first, first


def test_value_and_gradient_are_read_on_the_rank_when_graded(capsys):
    """As `dlcourse grade` runs it: the loss's gradient is taken on the rank, after the
    function returned, and comes back as data; a loss without its graph still fails."""
    check_load_balance_loss(Submitted("load_balance_loss", pickling.dumps(load_balance_loss)))
    assert "load_balance_loss: passed" in capsys.readouterr().out
    _, hint = first_line_and_hint(check_load_balance_loss,
                                  Submitted("load_balance_loss", pickling.dumps(detached)))
    assert "P_e must keep its graph" in hint, hint
