"""Lesson 07's check of best_layout (`dlcourse/checks/combine/best_layout.py`): the solutions and
correct answers written other ways pass; the wrong answers students write fail with a message
naming the case, the rank and a hint that says which mistake it was. Every run draws new cases,
so each wrong answer here fails on whatever is drawn."""

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine import check_best_layout
from test_checks_cost_per_million_tokens import cost


# --- exercise 6: best_layout -----------------------------------------------------------------

def layout_cost(c, price, tokens):
    return cost(c["compute_time_s"], c["n_stages"], c["n_micro"], tokens, c["n_gpus"], price)


def best(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    key = lambda c: layout_cost(c, price_per_gpu_hour, tokens_per_step)
    return min(fits, key=key)["name"] if fits else None


def best_sorted_gpu_seconds(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    def gpu_seconds(c):  # the price and the tokens are the same for all: GPU-seconds decide
        return c["n_gpus"] * c["compute_time_s"] * (c["n_micro"] + c["n_stages"] - 1) / c["n_micro"]
    ranked = sorted(candidates, key=lambda c: (c["bytes_per_gpu"] > memory_budget, gpu_seconds(c)))
    return ranked[0]["name"] if ranked[0]["bytes_per_gpu"] <= memory_budget else None


def best_ignores_memory(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    key = lambda c: layout_cost(c, price_per_gpu_hour, tokens_per_step)
    return min(candidates, key=key)["name"]


def best_fastest(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    step = lambda c: c["compute_time_s"] * (c["n_micro"] + c["n_stages"] - 1) / c["n_micro"]
    return min(fits, key=step)["name"] if fits else None


def best_ignores_the_bubble(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    return min(fits, key=lambda c: c["n_gpus"] * c["compute_time_s"])["name"] if fits else None


def best_strict_budget(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    return best([c for c in candidates if c["bytes_per_gpu"] < memory_budget], memory_budget,
                price_per_gpu_hour, tokens_per_step)


def best_never_none(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    return best(candidates, memory_budget, price_per_gpu_hour, tokens_per_step) or \
        min(candidates, key=lambda c: c["bytes_per_gpu"])["name"]


@pytest.mark.parametrize("answer", [best, best_sorted_gpu_seconds])
def test_best_layout_passes_correct_answers(answer, capsys):
    check_best_layout(answer)
    assert "best_layout: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (best_ignores_memory, "does not fit cannot run"),
    (best_fastest, "fastest step, not the cheapest"),
    (best_ignores_the_bubble, "its pipeline idles"),
    (best_strict_budget, ""),
    (best_never_none, "return None"),
])
def test_best_layout_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_best_layout, answer)
    assert first.startswith("best_layout(") and "expected" in first, first
    assert hint in got_hint, got_hint


@pytest.mark.parametrize("answer", [best_fastest, best_ignores_the_bubble])
def test_a_case_that_cannot_tell_two_mistakes_apart_names_both(answer):
    # Seed 1564488903 draws a case whose fastest step is also its least compute (CI found it):
    # either mistake picks that layout, so the hint must name both, not guess one.
    _, hint = first_line_and_hint(check_best_layout, answer, seed=1564488903)
    assert "fastest step, not the cheapest" in hint and "its pipeline idles" in hint, hint
