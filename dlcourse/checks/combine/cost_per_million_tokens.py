"""Lesson 07, exercise 5 (`exercises/07_combining.ipynb`): `check_cost_per_million_tokens`, the
dollars a million tokens cost from a step's compute time, on cases drawn afresh: compute times
from milliseconds to minutes on pipelines of 1 to 16 stages (the bubble, lesson 06's idle share
of the step, must be paid for), 16 to 4096 GPUs, prices. The reference is `costs.py`; the
planner is refused while the student's function runs.
"""

import math
import numbers

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.combine.costs import SECONDS_PER_HOUR, reference_cost
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind


CASES = 8


COST_HINT = ("the step lasts longer than its compute: lesson 06's bubble (p - 1)/(m + p - 1) is "
             "the idle share of the step, so step = compute / (1 - bubble); a step costs "
             "n_gpus x price per GPU-hour x its hours (seconds / 3600); divide by the step's "
             "tokens in millions")


def draw_cost_case(rng, pipelined=True):
    """(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour); with
    a pipeline of 2 to 16 stages and 1 to 64 micro-batches unless `pipelined` is False."""
    p = rng.choice((2, 3, 4, 8, 16)) if pipelined else 1
    m = rng.randint(1, 64) if p > 1 else rng.randint(1, 8)
    return (round(rng.uniform(0.01, 120.0), 3), p, m,
            rng.randrange(1, 64) * 2 ** rng.randrange(10, 23),
            rng.choice((16, 64, 512, 4096)), round(rng.uniform(0.3, 6.0), 2))


@fresh_cases
def check_cost_per_million_tokens(cost_per_million_tokens, *, rng):
    """cost_per_million_tokens(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
    price_per_gpu_hour) must return the dollars that training on one million tokens costs,
    the pipeline's bubble included."""
    __tracebackhide__ = True
    expect_callable(cost_per_million_tokens, "cost_per_million_tokens")
    for i in range(CASES):
        args = draw_cost_case(rng, pipelined=i != 1)  # one case without a pipeline
        where = ("cost_per_million_tokens(compute_time_s={}, n_stages={}, n_micro={}, "
                 "tokens_per_step={:,}, n_gpus={}, price_per_gpu_hour={})".format(*args))
        got = call_in_process(cost_per_million_tokens, args, exercise="cost_per_million_tokens",
                              where=where, guard=ANSWERS.in_process, hint=COST_HINT)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of dollars", COST_HINT)
        want = reference_cost(*args)
        if not math.isclose(got, want, rel_tol=1e-9):  # the same arithmetic in another order
            fail(where, None, f"returned ${got:.6g}, expected ${want:.6g} per million tokens",
                 _cost_hint(got, want, args))
    print(f"cost_per_million_tokens: passed on {CASES} cases (pipelines of 1 to 16 stages, "
          "0.01 s to 2 min of compute, 16 to 4096 GPUs)")


def _cost_hint(got, want, args):
    """Name the mistake by the factor between the answers."""
    compute, p, m = args[:3]
    bubble = (p - 1) / (m + p - 1)
    if p > 1 and math.isclose(got, want * (1 - bubble), rel_tol=1e-9):
        return ("that is the cost of the compute alone: the pipeline idles a share (p - 1)/(m + "
                "p - 1) of the step, and the idle GPUs are paid for too")
    if p > 1 and math.isclose(got, want * (1 - bubble) * (1 + bubble), rel_tol=1e-9):
        return ("the bubble is a share of the step, not of the compute: step x (1 - bubble) = "
                "compute, so step = compute / (1 - bubble)")
    known = {1e-6: "that is the cost of one token: a million tokens cost 1,000,000 times more",
             1e6: "that is a million times too much: divide by the tokens in millions, "
                  "tokens_per_step / 1e6",
             SECONDS_PER_HOUR: "the step time is in seconds and the price per hour: divide the "
                               "seconds by 3600, do not multiply",
             1 / SECONDS_PER_HOUR: "the step time is in seconds and the price per hour: convert "
                                   "the seconds to hours (/ 3600) once",
             SECONDS_PER_HOUR ** 2: "the step time is in seconds and the price per hour: divide "
                                    "the seconds by 3600, do not multiply"}
    for factor, says in known.items():
        if math.isclose(got, want * factor, rel_tol=1e-9):
            return says
    return COST_HINT
