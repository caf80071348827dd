"""Lesson 07's check of first_stage_activation_bytes
(`dlcourse/checks/combine/first_stage_activation_bytes.py`): the solutions and correct answers
written other ways pass; the wrong answers students write fail with a message naming the case, the
rank and a hint that says which mistake it was. Every run draws new cases, so each wrong answer here
fails on whatever is drawn."""

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine import check_first_stage_activation_bytes


# --- exercise 7: first_stage_activation_bytes ------------------------------------------------

def first_stage_closed_form(layer_bytes, n_layers, p, m, v):
    chunk = n_layers // (p * v) * layer_bytes
    warmup = 2 * (p - 1) + (v - 1) * p if v > 1 else p - 1
    return min(warmup + 1, m * v) * chunk


def first_stage_simulated(layer_bytes, n_layers, p, m, v):
    """Written another way: play the first rank's warm-up and steady state, count the peak."""
    total = m * v
    warmup = min(total, p - 1 if v == 1 else 2 * (p - 1) + (v - 1) * p)
    held = peak = 0
    for k in range(total):  # forward k; after the warm-up each forward is followed by a backward
        held += 1
        peak = max(peak, held)
        if k >= warmup:
            held -= 1
    return peak * n_layers / (p * v) * layer_bytes


def first_stage_doubled(layer_bytes, n_layers, p, m, v):  # interleaving's factor at every v
    return p * (1 + (p - 1) / (p * v)) * n_layers / p * layer_bytes


def first_stage_whole_chunks(layer_bytes, n_layers, p, m, v):  # a chunk counted as a stage
    return first_stage_closed_form(layer_bytes, n_layers, p, m, v) * v


def first_stage_no_cap(layer_bytes, n_layers, p, m, v):  # m < p forgotten
    return first_stage_closed_form(layer_bytes, n_layers, p, max(m, p), v)


def first_stage_interleaving_saves(layer_bytes, n_layers, p, m, v):  # 1F1B's count for all v
    return min(m, p) * n_layers / p * layer_bytes


def first_stage_from_lesson_06(layer_bytes, n_layers, p, m, v):
    from dlcourse.parallel.pipeline.measure import in_flight_peak
    from dlcourse.parallel.pipeline.schedules import interleaved_1f1b
    return in_flight_peak(interleaved_1f1b(0, p, m, v)) * n_layers / (p * v) * layer_bytes


@pytest.mark.parametrize("answer", [first_stage_closed_form, first_stage_simulated])
def test_first_stage_passes_correct_answers(answer, capsys):
    check_first_stage_activation_bytes(answer)
    assert "first_stage_activation_bytes: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (first_stage_doubled, "interleaving's factor (1 + (p - 1)/(p v)) at v = 1"),
    (first_stage_whole_chunks, "1/v of a stage's layers"),
    (first_stage_interleaving_saves, "it holds more, not less"),
    (first_stage_no_cap, ""),
])
def test_first_stage_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_first_stage_activation_bytes, answer)
    assert first.startswith("first_stage_activation_bytes(") and "expected" in first, first
    assert hint in got_hint, got_hint


def test_first_stage_refuses_lesson_06s_count():
    first, _ = first_line_and_hint(check_first_stage_activation_bytes, first_stage_from_lesson_06)
    assert "which this exercise does not allow" in first, first
