"""Lesson 06's check of stage_boundaries (`dlcourse/checks/pipeline/stage_boundaries.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn."""

import itertools

import pytest

from checking import first_line_and_hint, starts
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.pipeline import check_stage_boundaries


# --- exercise 1: stage boundaries ----------------------------------------------------------


def boundaries(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    out = [0]
    for s in range(n_stages):
        out.append(out[-1] + base + (s < extra))
    return out


def boundaries_dealt(n_layers, n_stages):  # blocks dealt out one by one, then counted
    held = [0] * n_stages
    for block in range(n_layers):
        held[block % n_stages] += 1
    return [0, *itertools.accumulate(held)]


def boundaries_rest_on_the_last(n_layers, n_stages):
    base = n_layers // n_stages
    return [base * s for s in range(n_stages)] + [n_layers]


def boundaries_middle_first(n_layers, n_stages):  # Llama 3: the ends lighter, extras inside
    base, extra = divmod(n_layers, n_stages)
    order = list(range(1, n_stages - 1)) + [0]  # middle stages, then the first; never the last
    sizes = [base + (s in order[:extra]) for s in range(n_stages)]
    return [0, *itertools.accumulate(sizes)]


def boundaries_spread(n_layers, n_stages):  # balanced, but the last stage gets an extra block
    return [s * n_layers // n_stages for s in range(n_stages + 1)]


def boundaries_extra_last(n_layers, n_stages):  # balanced, the extra blocks on the last stages
    return [n_layers - b for b in boundaries(n_layers, n_stages)][::-1]


def boundaries_for_four_stages(n_layers, n_stages):
    base, extra = divmod(n_layers, 4)
    return [0, *itertools.accumulate(base + (s < extra) for s in range(4))]


def sizes_not_boundaries(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    return [base + (s < extra) for s in range(n_stages)]


@pytest.mark.parametrize("answer", [boundaries, boundaries_dealt, boundaries_middle_first])
def test_stage_boundaries_pass(answer, capsys):
    check_stage_boundaries(answer)
    assert "stage_boundaries: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (boundaries_rest_on_the_last, "stage_boundaries(n_layers=", "n_layers % n_stages"),
    (boundaries_spread, "stage_boundaries(n_layers=", "output layer and the loss"),
    (boundaries_extra_last, "stage_boundaries(n_layers=", "output layer and the loss"),
    (boundaries_for_four_stages, "stage_boundaries(n_layers=", "boundaries"),
    (sizes_not_boundaries, "stage_boundaries(n_layers=", "running sums"),
])
def test_stage_boundaries_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_stage_boundaries, answer)
    assert starts(first, says) and hint in got_hint, (first, got_hint)


def test_a_failure_prints_the_seed_and_the_seed_draws_the_same_cases():
    with pytest.raises(CheckFailed) as failed:
        check_stage_boundaries(boundaries_spread)
    seed = int(str(failed.value).rsplit("seed ", 1)[1].split(":")[0])
    with pytest.raises(CheckFailed) as again:
        check_stage_boundaries(boundaries_spread, seed=seed)
    assert str(again.value) == str(failed.value)
