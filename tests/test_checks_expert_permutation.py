"""Lesson 09, exercise 6 (`dlcourse/checks/expert/permutation.py`): the permutation by
destination and its inverse. Right answers written other ways (numpy, Python lists, a counting
sort, index_add) pass; the wrong answers students write fail with a message naming the case and
a hint naming the mistake; the lesson's permutation and combine, and the check's reference, are
refused however they are reached. Cases are drawn afresh on every run."""

import numpy as np
import pytest
import torch

from checking import first_line_and_hint, starts
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.expert import check_permutation


def permute_by_destination(experts, n_experts):
    return torch.argsort(experts.flatten(), stable=True)


def unpermute(y, order, weights):
    N, k = weights.shape
    back = torch.empty_like(y)
    back[order] = y  # row i goes back to assignment order[i]
    return (back.view(N, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


def permute_counting_sort(experts, n_experts):  # offsets from bincount, a loop
    flat = experts.flatten().tolist()
    counts = torch.bincount(torch.tensor(flat), minlength=n_experts)
    start = (counts.cumsum(0) - counts).tolist()
    order = [0] * len(flat)
    for a, e in enumerate(flat):
        order[start[e]] = a
        start[e] += 1
    return order


def permute_in_numpy(experts, n_experts):
    return np.argsort(experts.numpy().ravel(), kind="stable")


def unpermute_in_numpy(y, order, weights):
    N, k = weights.shape
    out = np.zeros((N, y.shape[1]))
    tokens = order.numpy() // k
    np.add.at(out, tokens, y.numpy() * weights.numpy().ravel()[order.numpy()][:, None])
    return out


def unpermute_as_lists(y, order, weights):
    return unpermute(y, order, weights).tolist()


def unstable(experts, n_experts):  # each expert's assignments in reverse order
    flat = experts.flatten()
    return torch.argsort(flat * flat.numel() - torch.arange(flat.numel()))


def counts_from_unique(experts, n_experts):  # right only when every expert gets tokens
    flat = experts.flatten()
    _, counts = torch.unique(flat, return_counts=True)
    start = counts.cumsum(0) - counts
    order = torch.empty_like(flat)
    for a, e in enumerate(flat.tolist()):
        order[start[e]] = a
        start[e] += 1
    return order


def inverse_is_the_permutation(y, order, weights):
    N, k = weights.shape
    return (y[order].view(N, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


def not_weighted(y, order, weights):
    return unpermute(y, order, torch.ones_like(weights))


def first_choice_only(y, order, weights):
    N, k = weights.shape
    back = torch.empty_like(y)
    back[order] = y
    return back.view(N, k, -1)[:, 0] * weights[:, :1]


def in_float32(y, order, weights):
    return unpermute(y.float(), order, weights.float())


def with_the_lessons_permute(experts, n_experts):
    from dlcourse.moe import permute
    return permute(experts, torch.ones_like(experts, dtype=torch.bool), n_experts)[0]


def with_the_lessons_inverse(y, order, weights):
    from dlcourse.parallel.expert import inverse_permutation
    N, k = weights.shape
    return (y[inverse_permutation(order)].view(N, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


def with_the_lessons_combine(y, order, weights):
    from dlcourse.moe import combine
    return combine(y, weights.flatten()[order], order // weights.size(1), weights.size(0))


def with_sort_by_local_expert(experts, n_experts):
    from dlcourse.parallel.expert.experts import sort_by_local_expert
    return sort_by_local_expert(torch.bincount(experts.flatten(), minlength=n_experts)[None])


def with_the_checks_reference(experts, n_experts):
    from dlcourse.checks.expert.reference import by_destination
    return by_destination(experts, n_experts)


@pytest.mark.parametrize("permute, inverse", [
    (permute_by_destination, unpermute),
    (permute_counting_sort, unpermute_as_lists),
    (permute_in_numpy, unpermute_in_numpy),
])
def test_right_answers_pass(permute, inverse, capsys):
    check_permutation(permute, inverse)
    assert "permutation: passed" in capsys.readouterr().out


@pytest.mark.parametrize("permute, hint", [
    (unstable, "the sort must be stable"),
    (counts_from_unique, "counts per expert need a 0 for it"),
])
def test_wrong_permutations_fail(permute, hint):
    first, got_hint = first_line_and_hint(check_permutation, permute, unpermute)
    assert starts(first, "permute_by_destination(experts (") and hint in got_hint, (first, got_hint)


@pytest.mark.parametrize("inverse, hint", [
    (inverse_is_the_permutation, "that applies the permutation again"),
    (not_weighted, "without their router weights"),
    (first_choice_only, "only each token's first choice came back"),
    (in_float32, "within float32 rounding"),
])
def test_wrong_inverses_fail(inverse, hint):
    first, got_hint = first_line_and_hint(check_permutation, permute_by_destination, inverse)
    assert starts(first, "unpermute(y (") and hint in got_hint, (first, got_hint)


@pytest.mark.parametrize("permute, inverse, refused", [
    (with_the_lessons_permute, unpermute, "called permute from dlcourse.moe"),
    (with_sort_by_local_expert, unpermute,
     "called sort_by_local_expert from dlcourse.parallel.expert.experts"),
    (with_the_checks_reference, unpermute,
     "called by_destination from dlcourse.checks.expert.reference"),
    (permute_by_destination, with_the_lessons_inverse,
     "called inverse_permutation from dlcourse.parallel.expert.experts"),
    (permute_by_destination, with_the_lessons_combine, "called combine from dlcourse.moe"),
])
def test_the_lessons_permutation_and_the_checks_reference_are_refused(permute, inverse, refused):
    first, _ = first_line_and_hint(check_permutation, permute, inverse)
    assert f"{refused}, which this exercise does not allow" in first, first


def test_a_failure_names_the_seed_that_draws_the_same_cases():
    with pytest.raises(CheckFailed) as failed:
        check_permutation(unstable, unpermute)
    seed = int(str(failed.value).rsplit("seed ", 1)[1].split(":")[0])
    with pytest.raises(CheckFailed) as again:
        check_permutation(unstable, unpermute, seed=seed)
    assert str(again.value) == str(failed.value)
