"""Lesson 09, exercise 4 (`dlcourse/checks/expert/moe_layer_counts.py`): an MoE layer's total and
active parameters and forward FLOPs per token. Whole numbers of any plain type pass (numpy integers,
a Fraction, a list); each wrong count fails with the hint that names the mistake; the course's
counts (`params_per_token`, `count_params` of a `MoEConfig`, the `MoE` layer) are refused."""

from fractions import Fraction

import numpy as np
import pytest

from checking import first_line_and_hint, starts
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.expert import check_moe_layer_counts


def moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias):
    router = n_experts * hidden
    expert = 2 * hidden * expert_hidden + ((expert_hidden + hidden) if bias else 0)
    flops = 2 * (router + top_k * 2 * hidden * expert_hidden)
    return router + n_experts * expert, router + top_k * expert, flops


def counts_in_numpy(hidden, expert_hidden, n_experts, top_k, bias):  # numpy ints, a list
    shapes = np.array([[expert_hidden, hidden], [hidden, expert_hidden]])
    weights = np.prod(shapes, axis=1).sum()
    expert = weights + (shapes[:, 0].sum() if bias else 0)
    router = np.int64(n_experts) * hidden
    return [router + n_experts * expert, router + top_k * expert, 2 * (router + top_k * weights)]


def counts_as_fractions(hidden, expert_hidden, n_experts, top_k, bias):
    total, active, flops = moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias)
    return Fraction(total), Fraction(active * 2, 2), Fraction(flops)


def no_router(hidden, expert_hidden, n_experts, top_k, bias):
    total, active, flops = moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias)
    return total - n_experts * hidden, active - n_experts * hidden, flops


def active_is_total(hidden, expert_hidden, n_experts, top_k, bias):
    total, _, flops = moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias)
    return total, total, flops


def training_flops(hidden, expert_hidden, n_experts, top_k, bias):
    total, active, flops = moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias)
    return total, active, 3 * flops


def flops_of_every_expert(hidden, expert_hidden, n_experts, top_k, bias):
    total, active, _ = moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias)
    return total, active, 2 * total


def with_the_library(hidden, expert_hidden, n_experts, top_k, bias):
    from dlcourse.memory import count_params
    from dlcourse.models import MoEConfig
    config = MoEConfig(hidden=hidden, expert_hidden=expert_hidden, n_experts=n_experts,
                       top_k=top_k, bias=bias, n_heads=1)
    return count_params(config), count_params(config, active=True), 0


def with_the_lessons_measure(hidden, expert_hidden, n_experts, top_k, bias):
    from dlcourse.parallel.expert.measure import params_per_token
    return params_per_token(None)


@pytest.mark.parametrize("answer", [moe_layer_counts, counts_in_numpy, counts_as_fractions])
def test_moe_layer_counts_passes(answer, capsys):
    check_moe_layer_counts(answer)
    assert "moe_layer_counts: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (no_router, "returned total = ", "the router is a parameter too"),
    (active_is_total, "returned active = ", "k of the E experts only"),
    (training_flops, "returned forward FLOPs per token = ", "6 per weight is training"),
    (flops_of_every_expert, "returned forward FLOPs per token = ", "not all E"),
])
def test_moe_layer_counts_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_moe_layer_counts, answer)
    assert starts(first, "moe_layer_counts(hidden=") and says in first and hint in got_hint, \
        (first, got_hint)


@pytest.mark.parametrize("answer, refused", [
    (with_the_library, "called count_params from dlcourse.memory.accounting"),
    (with_the_lessons_measure, "called params_per_token from dlcourse.parallel.expert.measure"),
])
def test_the_courses_counts_are_refused(answer, refused):
    first, _ = first_line_and_hint(check_moe_layer_counts, answer)
    assert refused in first, first


def test_numpy_counts_pass_when_graded(capsys):
    """As `dlcourse grade` runs it: on a rank, numpy integers read back as data."""
    check_moe_layer_counts(Submitted("moe_layer_counts", pickling.dumps(counts_in_numpy)))
    assert "moe_layer_counts: passed" in capsys.readouterr().out
