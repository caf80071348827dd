"""Lesson 07's check of cost_per_million_tokens
(`dlcourse/checks/combine/cost_per_million_tokens.py`): the solutions and correct answers written
other ways pass; the wrong answers students write fail with a message naming the case, the rank and
a hint that says which mistake it was. Every run draws new cases, so each wrong answer here fails on
whatever is drawn."""

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine import check_cost_per_million_tokens
from dlcourse.planner.estimate import estimate


# --- exercise 5: cost_per_million_tokens -----------------------------------------------------

def cost(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour):
    bubble = (n_stages - 1) / (n_micro + n_stages - 1)
    step = compute_time_s / (1 - bubble)
    return n_gpus * price_per_gpu_hour * step / 3600 / tokens_per_step * 1e6


def cost_via_throughput(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                        price_per_gpu_hour):
    step = compute_time_s * (1 + (n_stages - 1) / n_micro)  # Narayanan's (p - 1)/m of the ideal
    tokens_per_hour = tokens_per_step / step * 3600
    return n_gpus * price_per_gpu_hour / (tokens_per_hour / 1e6)


def cost_no_bubble(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                   price_per_gpu_hour):
    return n_gpus * price_per_gpu_hour * compute_time_s / 3600 / tokens_per_step * 1e6


def cost_bubble_of_compute(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                           price_per_gpu_hour):
    step = compute_time_s * (1 + (n_stages - 1) / (n_micro + n_stages - 1))
    return n_gpus * price_per_gpu_hour * step / 3600 / tokens_per_step * 1e6


def cost_per_token(*args):
    return cost(*args) / 1e6


def cost_hours_times(*args):
    return cost(*args) * 3600 ** 2


def cost_seconds_as_hours(*args):
    return cost(*args) * 3600


def cost_one_gpu(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour):
    return cost(compute_time_s, n_stages, n_micro, tokens_per_step, 1, price_per_gpu_hour)


def cost_from_the_planner(*args):
    estimate(None, None, None)


@pytest.mark.parametrize("answer", [cost, cost_via_throughput])
def test_cost_passes_correct_answers(answer, capsys):
    check_cost_per_million_tokens(answer)
    assert "cost_per_million_tokens: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (cost_no_bubble, "idle GPUs are paid for too"),
    (cost_bubble_of_compute, "share of the step, not of the compute"),
    (cost_per_token, "cost of one token"),
    (cost_hours_times, "divide the seconds by 3600"),
    (cost_seconds_as_hours, "divide the seconds by 3600"),
    (cost_one_gpu, ""),
])
def test_cost_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_cost_per_million_tokens, answer)
    assert first.startswith("cost_per_million_tokens(") and "expected $" in first, first
    assert hint in got_hint, got_hint


def test_cost_refuses_the_planner():
    first, _ = first_line_and_hint(check_cost_per_million_tokens, cost_from_the_planner)
    assert "estimate from dlcourse.planner.estimate" in first, first
