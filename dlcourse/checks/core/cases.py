"""Cases drawn afresh on every run, one way for every check: `@fresh_cases`. A check written as
`check(fn, ..., rng)` gets `seed=None` instead of `rng`; the seed is one of 2**31, too many to try
them all within a check's time limit, and a failure ends by naming it, so that `seed=` replays
the run.
"""

import functools
import random

from dlcourse.checks.core.expect import CheckFailed


def _draw(seed=None):
    """(seed, rng) of this run's cases: `seed` replays a run, else a fresh one is drawn."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    return seed, random.Random(seed)


def fresh_cases(check):
    """Give `check(fn, ..., rng)` a `seed=None` argument instead of `rng`: each run draws a
    fresh seed, so the cases (sizes, world sizes, values) cannot be known in advance, and a
    failure ends by naming the seed that repeats them."""

    @functools.wraps(check)
    def run(fn, *args, seed=None, **kwargs):
        __tracebackhide__ = True
        seed, rng = _draw(seed)
        try:
            return check(fn, *args, rng=rng, **kwargs)
        except CheckFailed as error:
            again = (f"\n(cases drawn from seed {seed}: {check.__name__}(your_function, "
                     f"seed={seed}) draws the same ones again)")
            raise CheckFailed(str(error) + again).with_traceback(None) from error.__cause__

    return run
