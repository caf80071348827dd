"""Lesson 06's check of last_stage_backward (`dlcourse/checks/pipeline/last_stage_backward.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn."""

import pytest
import torch

from checking import first_line_and_hint, starts
from dlcourse.checks.pipeline import check_last_stage_backward


# --- exercise 3: the loss scaled over micro-batches -----------------------------------------


def last_stage_backward(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    (loss_fn(stage(x), target) / n_micro).backward()
    return x.grad


def last_stage_backward_new_leaf(stage, x, target, loss_fn, n_micro):
    x = x.detach().requires_grad_()
    output = stage(x)
    # the output's gradient scaled instead of the loss: the same chain rule
    grad = torch.autograd.grad(loss_fn(output, target), output)[0] * (1.0 / n_micro)
    output.backward(grad)
    return x.grad


def loss_not_divided(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    loss_fn(stage(x), target).backward()
    return x.grad


def parameters_scaled_after_backward(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    before = [p.grad.clone() if p.grad is not None else 0 for p in stage.parameters()]
    loss_fn(stage(x), target).backward()
    with torch.no_grad():
        for p, old in zip(stage.parameters(), before):  # only this micro-batch's part, scaled
            p.grad.copy_(old + (p.grad - old) / n_micro)
    return x.grad  # unscaled: the earlier stages get n_micro times theirs


def divided_by_the_micro_batch_size(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    (loss_fn(stage(x), target) / len(x)).backward()
    return x.grad


def zero_grad_each_micro_batch(stage, x, target, loss_fn, n_micro):
    stage.zero_grad()
    return last_stage_backward(stage, x, target, loss_fn, n_micro)


def no_requires_grad(stage, x, target, loss_fn, n_micro):
    (loss_fn(stage(x), target) / n_micro).backward()
    return x.grad


@pytest.mark.parametrize("answer", [last_stage_backward, last_stage_backward_new_leaf])
def test_last_stage_backward_passes(answer, capsys):
    check_last_stage_backward(answer)
    assert "last_stage_backward: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (loss_not_divided, "rank ? layer", "times the whole batch's: each micro-batch's loss"),
    (parameters_scaled_after_backward, "rank ? layer", "so that x.grad, which goes back"),
    (divided_by_the_micro_batch_size, "rank ? layer", "n_micro"),  # "n_micro times" if b = 1
    (zero_grad_each_micro_batch, "rank ? layer", "requires_grad_"),
    (no_requires_grad, "rank ? ", "requires_grad_"),
])
def test_last_stage_backward_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_last_stage_backward, answer)
    assert first.startswith("last_stage_backward on "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)
