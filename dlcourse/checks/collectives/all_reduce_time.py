"""Lesson 02's cost exercise: `check_all_reduce_time(all_reduce_time)`, the alpha-beta time of
a ring all-reduce. The check calls the student's function in this process and compares it with
the lesson's `predict_time("ring all_reduce", ...)`, which (with the table it reads) refuses to
run meanwhile, as do these checks' own functions. Under `dlcourse grade` the student's function
runs on a rank that has neither `dlcourse.collectives.cost` nor these checks (`TIME_ANSWERS`).
"""

import math
import numbers

import torch

from dlcourse.checks.collectives.answers import ANSWERS
from dlcourse.checks.collectives.in_rank import COST, no_cost_table
from dlcourse.checks.core import call_in_process, fail, fresh_cases, kind
from dlcourse.collectives import cost

# ---------------------------------------------------------------- exercise 4: the time it takes

# (nbytes, world_size, alpha in s, beta in s per byte)
TIME_CASES = [
    (4 << 20, 4, 100e-6, 1 / 2e9),  # 4 MB on 4 CPU ranks as in the lesson: 100 us, 2 GB/s
    (1 << 30, 8, 5e-6, 1 / 150e9),  # 1 GB of gradients on 8 GPUs over NVLink
    (4096, 64, 5e-6, 1 / 150e9),  # a small message on 64 GPUs: alpha decides
    (10**9 + 7, 1000, 20e-6, 1 / 25e9),  # 1000 ranks over InfiniBand; n does not divide S
]
# The same formula in another order of operations differs in the last bits of a float64,
# ~1e-16 relative; the nearest wrong answers (n for n - 1 with 1000 ranks) are 1e-3 off.
TIME_RTOL = 1e-9
TIME_HINT = ("count the steps and the bytes each rank sends: the reduce-scatter, then the "
             "all-gather; each step sends one chunk of S/n bytes and pays alpha once")


@fresh_cases
def check_all_reduce_time(all_reduce_time, *, rng):
    """all_reduce_time(nbytes, world_size, alpha, beta) must return the seconds the alpha-beta
    model gives a ring all-reduce, without the lesson's predict_time."""
    __tracebackhide__ = True
    drawn = [(rng.randint(10**3, 10**10), rng.randint(2, 2048), rng.uniform(1e-6, 1e-4),
              1 / rng.uniform(1e9, 1e12)) for _ in range(2)]
    for nbytes, n, alpha, beta in TIME_CASES + drawn:
        where = (f"all_reduce_time(nbytes={nbytes:,}, world_size={n}, alpha={alpha:g}, "
                 f"beta={beta:g})")
        got = _answer(all_reduce_time, (nbytes, n, alpha, beta), where)
        expected = cost.predict_time("ring all_reduce", nbytes, n, alpha, beta)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of seconds",
                 "return a plain float" + (" (float(t))" if isinstance(got, torch.Tensor) else ""))
        if not math.isclose(got, expected, rel_tol=TIME_RTOL):
            fail(where, None, f"returned {got:.6g} s, the alpha-beta model of a ring all-reduce "
                              f"gives {expected:.6g} s",
                 _time_hint(all_reduce_time, got, expected, nbytes, n))
    print(f"all_reduce_time: passed on {len(TIME_CASES) + len(drawn)} cases (4 to 1000 ranks, 4 KB to 1 GB), "
          "equal to the alpha-beta model")


def _answer(fn, args, where):
    """fn(*args) with the lesson's answer refused; any error becomes a CheckFailed."""
    __tracebackhide__ = True
    return call_in_process(fn, args, exercise="all_reduce_time", where=where,
                           guard=TIME_ANSWERS.in_process)


# predict_time, its table and these checks' own functions (`answers.py`); a graded rank loads
# `in_rank.py` alone (`ANSWERS.rank_side`), without `cost.py`, which this makes absent there
TIME_ANSWERS = ANSWERS.but(single=((COST, "predict_time"),), also=(no_cost_table,),
                           why="it is the answer; work out the steps and bytes yourself")


def _time_hint(fn, got, expected, nbytes, n):
    """Take the student's formula apart: with alpha = 1 s and beta = 0 it returns its number of
    steps, with alpha = 0 and beta = 1 s per byte its bytes. Say which term is off, and how."""
    for unit, per_second in (("milliseconds", 1e3), ("microseconds", 1e6)):
        if math.isclose(got, expected * per_second, rel_tol=TIME_RTOL):
            return f"that is the right time in {unit}: return seconds, as alpha is given"
    steps, moved = _quietly(fn, (nbytes, n, 1.0, 0.0)), _quietly(fn, (nbytes, n, 0.0, 1.0))
    notes = []
    if steps is not None and not math.isclose(steps, 2 * (n - 1), rel_tol=TIME_RTOL):
        notes.append(_steps_note(steps, n))
    if moved is not None and not math.isclose(moved, 2 * (n - 1) / n * nbytes, rel_tol=TIME_RTOL):
        notes.append(_bytes_note(moved / nbytes, n))
    return " ".join(notes) or TIME_HINT


def _quietly(fn, args):
    try:
        with TIME_ANSWERS.in_process(fn):
            value = fn(*args)
        return float(value)
    except Exception:
        return None


def _steps_note(steps, n):
    says = {n - 1: "one phase: the all-gather takes n - 1 more steps after the reduce-scatter's",
            2 * n: "each phase takes n - 1 steps, not n: after n - 1 steps a chunk has been to "
                   "all n ranks",
            1: "every step is a message that waits for the one before it, so each pays alpha"}
    why = says.get(round(steps)) if math.isclose(steps, round(steps)) else None
    return (f"Your alpha term counts {steps:g} message step{'' if steps == 1 else 's'}, a ring "
            f"all-reduce makes 2(n - 1) = {2 * (n - 1)}" + (f": {why}." if why else "."))


def _bytes_note(ratio, n):
    says = [((n - 1) / n, "one phase: the all-gather sends as much again as the reduce-scatter"),
            (2.0, "each rank sends 2(n - 1) chunks of S/n, a little less than 2 S"),
            (2 * (n - 1), "that is what the naive all-reduce's root sends; a ring rank sends "
                          "2(n - 1) chunks of S/n"),
            (1.0, "each rank sends 2(n - 1) chunks of S/n")]
    why = next((text for r, text in says if math.isclose(ratio, r, rel_tol=TIME_RTOL)), None)
    return (f"Your beta term moves {ratio:.6g} x S bytes through a rank's link, a ring "
            f"all-reduce 2(n - 1)/n x S = {2 * (n - 1) / n:.6g} x S"
            + (f": {why}." if why else "."))
