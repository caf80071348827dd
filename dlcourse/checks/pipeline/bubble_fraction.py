"""Lesson 06, exercise 5 (`exercises/06_pipeline.ipynb`): `check_bubble_fraction`, the idle share
of a GPipe or 1F1B step, a formula called here and compared with a timeline the check simulates
(`_simulated_bubble`).
"""

import numbers

import torch

from dlcourse.checks.core import call_each_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.stages import join, stage_counts


BUBBLE_HINT = ("the last stage starts p - 1 forward times late and stage 0 finishes p - 1 "
               "backward times after it: idle / (idle + busy) = (p - 1) / (m + p - 1)")
T_FORWARD, T_BACKWARD = 1.0, 2.0  # a backward costs about two forwards; the share does not care


@fresh_cases
def check_bubble_fraction(bubble_fraction, *, rng):
    """bubble_fraction(n_stages, n_micro) -> the share of a GPipe (or 1F1B) step a stage sits
    idle, against a timeline simulated here with forwards of 1 and backwards of 2."""
    __tracebackhide__ = True
    expect_callable(bubble_fraction, "bubble_fraction")
    cases = [(p, rng.randint(1, 4 * p)) for p in stage_counts(rng, 5) + [rng.randint(6, 8)]]
    calls = [((p, m), f"bubble_fraction(n_stages={p}, n_micro={m})") for p, m in cases]
    answers = call_each_in_process(bubble_fraction, calls, exercise="bubble_fraction",
                                   guard=ANSWERS.in_process)  # graded: every case in one launch
    for (p, m), (_, where), got in zip(cases, calls, answers):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number between 0 and 1",
                 BUBBLE_HINT)
        got, expected = float(got), _simulated_bubble(p, m)  # float: a Fraction is fine
        # a ratio of small whole numbers: float rounding only, ~1e-16
        if abs(got - expected) > 1e-12:
            fail(where, None, f"returned {got:.6g}, the simulated timeline is idle "
                              f"{expected:.6g} of the time", _bubble_hint(got, p, m))
    print(f"bubble_fraction: passed on {len(cases)} cases drawn at random "
          f"({join(sorted({p for p, _ in cases}))} stages; 1 to {max(m for _, m in cases)} "
          "micro-batches), equal to a simulated timeline's idle share")


def _simulated_bubble(p, m):
    """GPipe on a timeline: a forward starts when its input has arrived and its stage is free;
    the backwards start after the stage's last forward, each after the next stage's."""
    end_f = [[0.0] * m for _ in range(p)]
    for r in range(p):
        for i in range(m):
            start = max(end_f[r - 1][i] if r else 0.0, end_f[r][i - 1] if i else 0.0)
            end_f[r][i] = start + T_FORWARD
    end_b = [[0.0] * m for _ in range(p)]
    for r in reversed(range(p)):
        for i in range(m):
            start = max(end_b[r + 1][i] if r < p - 1 else 0.0,
                        end_b[r][i - 1] if i else end_f[r][m - 1])
            end_b[r][i] = start + T_BACKWARD
    total = max(max(row) for row in end_b)
    return 1 - m * (T_FORWARD + T_BACKWARD) / total


def _bubble_hint(got, p, m):
    if abs(got - (p - 1) / m) < 1e-9:
        return ("(p - 1) / m is the idle time over the busy time; the share of the whole step "
                "is idle / (idle + busy)")
    if abs(got - (1 - _simulated_bubble(p, m))) < 1e-9:
        return "that is the busy share; the bubble is the rest"
    return BUBBLE_HINT
