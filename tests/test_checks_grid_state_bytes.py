"""Lesson 07's check of grid_state_bytes (`dlcourse/checks/combine/grid_state_bytes.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn."""

import pytest

from checking import first_line_and_hint
from dlcourse.checks.combine import check_grid_state_bytes
from dlcourse.memory import model_state_bytes


# --- exercise 4: grid_state_bytes ------------------------------------------------------------

def state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision):
    per = (2, 2, 12) if mixed_precision else (4, 4, 8)
    split = [dp if zero_stage >= s else 1 for s in (3, 2, 1)]  # params, grads, optimizer
    return sum(b * n_params / (tp * pp * d) for b, d in zip(per, split))


def state_bytes_k_form(n_params, dp, tp, pp, zero_stage, mixed_precision):  # ZeRO paper's form
    p, g, k = (2, 2, 12) if mixed_precision else (4, 4, 8)
    psi = n_params / tp / pp
    return {0: (p + g + k) * psi, 1: (p + g) * psi + k * psi / dp,
            2: p * psi + (g + k) * psi / dp, 3: (p + g + k) * psi / dp}[zero_stage]


def state_bytes_zero_on_tp(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, tp, tp, pp, zero_stage, mixed_precision)  # ZeRO's division: tp


def state_bytes_dp_tp_swapped(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, tp, dp, pp, zero_stage, mixed_precision)


def state_bytes_no_pp(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, dp, tp, 1, zero_stage, mixed_precision)


def state_bytes_world(n_params, dp, tp, pp, zero_stage, mixed_precision):  # all over N
    return state_bytes(n_params, 1, 1, 1, 0, mixed_precision) / (dp * tp * pp)


def state_bytes_library(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return model_state_bytes(n_params / (tp * pp), dp=dp, zero_stage=zero_stage).total


@pytest.mark.parametrize("answer", [state_bytes, state_bytes_k_form])
def test_grid_state_bytes_passes_correct_answers(answer, capsys):
    check_grid_state_bytes(answer)
    assert "grid_state_bytes: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (state_bytes_zero_on_tp, "divides by tp where ZeRO divides"),
    (state_bytes_no_pp, "divide by pp too"),
    (state_bytes_dp_tp_swapped, ""),
    (state_bytes_world, ""),
])
def test_grid_state_bytes_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_grid_state_bytes, answer)
    assert first.startswith("grid_state_bytes(") and "bytes per rank, expected" in first, first
    assert hint in got_hint, got_hint


def test_grid_state_bytes_refuses_model_state_bytes():
    first, _ = first_line_and_hint(check_grid_state_bytes, state_bytes_library)
    assert "model_state_bytes" in first and "does not allow" in first, first
