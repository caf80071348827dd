"""Lesson 09, exercise 1 (`dlcourse/checks/expert/route_with_capacity.py`): top-k routing with
capacity. The solution and answers written another way (numpy, Python lists, a loop) pass; the wrong
answers students write fail with a message naming the case and a hint naming the mistake; the
lesson's router is refused however it is reached. Cases are drawn afresh on every run."""

import numpy as np
import pytest
import torch

from checking import first_line_and_hint, starts
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.expert import check_route_with_capacity


def route_with_capacity(logits, k, capacity):
    probs = torch.softmax(logits, dim=-1)
    top, experts = probs.topk(k, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    if capacity is None:
        return experts, weights, torch.ones_like(experts, dtype=torch.bool)
    flat = experts.T.flatten()  # choice-major: every first choice, then every second
    onehot = torch.nn.functional.one_hot(flat, logits.size(-1))
    place = (onehot.cumsum(0) - onehot)[torch.arange(flat.numel()), flat]
    return experts, weights, (place < capacity).view(k, -1).T


def route_in_numpy(logits, k, capacity):  # numpy arrays, softmax over the k chosen logits
    z = logits.numpy()
    experts = np.argsort(-z, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(z, experts, axis=1)
    w = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    keep = np.ones(experts.shape, dtype=bool)
    if capacity is not None:
        taken = np.zeros(z.shape[1], dtype=np.int64)
        for j in range(k):
            for n in range(z.shape[0]):
                keep[n, j] = taken[experts[n, j]] < capacity
                taken[experts[n, j]] += 1
    return experts, w / w.sum(axis=1, keepdims=True), keep


def route_as_lists(logits, k, capacity):  # a tuple of nested Python lists
    experts, weights, keep = route_with_capacity(logits, k, capacity)
    return experts.tolist(), weights.tolist(), keep.int().tolist()


def top_1(logits, k, capacity):
    return route_with_capacity(logits, 1, capacity)


def softmax_over_tokens(logits, k, capacity):
    probs = torch.softmax(logits, dim=0)
    top, experts = probs.topk(k, dim=-1)
    return experts, top / top.sum(dim=-1, keepdim=True), torch.ones_like(experts, dtype=torch.bool)


def not_renormalised(logits, k, capacity):
    experts, _, keep = route_with_capacity(logits, k, capacity)
    return experts, torch.softmax(logits, dim=-1).gather(1, experts), keep


def no_capacity(logits, k, capacity):
    return route_with_capacity(logits, k, None)


def queue_token_by_token(logits, k, capacity):
    experts, weights, keep = route_with_capacity(logits, k, None)
    if capacity is not None:
        taken = [0] * logits.size(1)
        for n in range(experts.size(0)):
            for j in range(k):
                keep[n, j] = taken[experts[n, j]] < capacity
                taken[experts[n, j]] += 1
    return experts, weights, keep


def with_the_library(logits, k, capacity):
    from dlcourse.moe import route
    _, weights, experts = route(logits, k)
    return experts, weights, torch.ones_like(experts, dtype=torch.bool)


def with_the_checks_reference(logits, k, capacity):
    from dlcourse.checks.expert.reference import routed
    return routed(logits, k, capacity)


@pytest.mark.parametrize("answer", [route_with_capacity, route_in_numpy, route_as_lists])
def test_route_with_capacity_passes(answer, capsys):
    check_route_with_capacity(answer)
    assert "route_with_capacity: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (top_1, "that is top-1"),
    (softmax_over_tokens, "softmax is over the tokens (dim 0)"),
    (not_renormalised, "renormalise them to sum to 1"),
    (no_capacity, "each expert takes at most capacity"),
    (queue_token_by_token, "every token's first choice before any second choice"),
])
def test_route_with_capacity_wrong_answers_fail(answer, hint):
    first, got_hint = first_line_and_hint(check_route_with_capacity, answer)
    assert starts(first, "route_with_capacity(logits (") and hint in got_hint, (first, got_hint)


@pytest.mark.parametrize("answer, refused", [
    (with_the_library, "called route from dlcourse.moe"),
    (with_the_checks_reference, "called routed from dlcourse.checks.expert.reference"),
])
def test_the_lessons_router_and_the_checks_reference_are_refused(answer, refused):
    first, _ = first_line_and_hint(check_route_with_capacity, answer)
    assert f"{refused}, which this exercise does not allow" in first, first


def test_a_failure_names_the_seed_that_draws_the_same_cases():
    with pytest.raises(CheckFailed) as failed:
        check_route_with_capacity(no_capacity)
    seed = int(str(failed.value).rsplit("seed ", 1)[1].split(":")[0])
    with pytest.raises(CheckFailed) as again:
        check_route_with_capacity(no_capacity, seed=seed)
    assert str(again.value) == str(failed.value)
