"""Lesson 05's check of zero_bytes_per_rank (`dlcourse/checks/zero/zero_bytes_per_rank.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail with a
message naming the case, the rank and a hint that says which mistake it was. Every run draws new
cases, so each wrong answer here fails on whatever is drawn."""

import math
import re

import pytest

from checking import first_line_and_hint
from dlcourse.checks.zero import check_zero_bytes_per_rank
from dlcourse.memory import model_state_bytes


# --- exercise 4: zero_bytes_per_rank ----------------------------------------------------------

PER = {True: (2, 2, 12), False: (4, 4, 8)}


def _bytes(n_params, world_size, stage, mixed, shard):
    parts = dict(zip(("params", "grads", "optimizer"), PER[mixed]))
    partitioned = ("optimizer", "grads", "params")[:stage]
    return {p: b * (shard(n_params, world_size) if p in partitioned else n_params)
            for p, b in parts.items()}


def zero_bytes_per_rank(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: -(-n // N))


def bytes_with_math_ceil(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: math.ceil(n / N))


def bytes_exact_division(n_params, world_size, stage, mixed_precision):  # N must divide Ψ
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: n / N)


def bytes_floor(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: n // N)


def bytes_stage_off_by_one(n_params, world_size, stage, mixed_precision):
    return zero_bytes_per_rank(n_params, world_size, min(stage + 1, 3), mixed_precision)


def bytes_padding_everywhere(n_params, world_size, stage, mixed_precision):
    padded = world_size * -(-n_params // world_size)
    got = zero_bytes_per_rank(padded, world_size, stage, mixed_precision)
    return got


def bytes_from_the_library(n_params, world_size, stage, mixed_precision):
    return model_state_bytes(n_params, dp=world_size, zero_stage=stage,
                             mixed_precision=mixed_precision).as_dict()


def bytes_from_a_captured_library(n_params, world_size, stage, mixed_precision,
                                  formula=model_state_bytes):  # bound before the check
    return formula(n_params, dp=world_size, zero_stage=stage).as_dict()


@pytest.mark.parametrize("answer", [zero_bytes_per_rank, bytes_with_math_ceil])
def test_zero_bytes_per_rank_passes_correct_answers(answer):
    check_zero_bytes_per_rank(answer)


@pytest.mark.parametrize("answer, hint", [
    (bytes_exact_division, "right only when N divides Ψ"),
    (bytes_floor, "rounds down"),
    (bytes_stage_off_by_one, "partition the"),
    (bytes_padding_everywhere, ""),
    (bytes_from_the_library, ""),
    (bytes_from_a_captured_library, ""),
])
def test_zero_bytes_per_rank_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_zero_bytes_per_rank, answer)
    assert re.match(r"zero_bytes_per_rank\(n_params=[\d,]+, .*\): ", first), first
    assert hint in got_hint
    if answer in (bytes_from_the_library, bytes_from_a_captured_library):
        assert "which this exercise does not allow" in first
