"""Cases drawn afresh on every run, one way for every check: `@fresh_cases`. A check written as
`check(fn, ..., rng)` gets `seed=None` instead of `rng`; the seed is one of 2**31, too many to try
them all within a check's time limit, and a failure ends by naming it, so that `seed=` replays
the run.

A pass is remembered for the objects it was given (held weakly: a function defined again is a
new object). `check_all` (`dlcourse/checks/summary.py`) runs inside `reuse_passes()`, where a
check its grader cell already passed with the same objects is not run a second time: the table
says so instead of drawing the same launches again.
"""

import contextlib
import contextvars
import functools
import random
import weakref

from dlcourse.checks.core.expect import CheckFailed

_REUSING = contextvars.ContextVar("reuse_passes", default=None)
_PASSED = {}  # (check, keyword names) -> [[(kind, weakref or value), ...] of a passing call]
_PLAIN = (str, int, float, bool, type(None))


def _draw(seed=None):
    """(seed, rng) of this run's cases: `seed` replays a run, else a fresh one is drawn."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    return seed, random.Random(seed)


def fresh_cases(check):
    """Give `check(fn, ..., rng)` a `seed=None` argument instead of `rng`: each run draws a
    fresh seed, so the cases (sizes, world sizes, values) cannot be known in advance, and a
    failure ends by naming the seed that repeats them."""
    name = f"{check.__module__}.{check.__qualname__}"

    @functools.wraps(check)
    def run(fn, *args, seed=None, **kwargs):
        __tracebackhide__ = True
        given = (fn, *args, *(kwargs[k] for k in sorted(kwargs)))
        key = (name, tuple(sorted(kwargs)))
        calls = _REUSING.get()
        if seed is None and calls is not None and _passed_before(key, given):
            calls["reused"].append(check.__name__)
            return None
        if calls is not None:
            calls["run"].append(check.__name__)
        seed, rng = _draw(seed)
        try:
            result = check(fn, *args, rng=rng, **kwargs)
        except CheckFailed as error:
            again = (f"\n(cases drawn from seed {seed}: {check.__name__}(your_function, "
                     f"seed={seed}) draws the same ones again)")
            raise CheckFailed(str(error) + again).with_traceback(None) from error.__cause__
        _remember(key, given)
        return result

    return run


def _held(value):
    """What identifies one argument later: a plain value itself, anything else by a weak
    reference (None where it cannot be held weakly: such a call is not remembered)."""
    if isinstance(value, _PLAIN):
        return ("value", value)
    try:
        return ("ref", weakref.ref(value))
    except TypeError:
        return None


def _remember(key, given):
    held = [_held(value) for value in given]
    if None not in held:
        _PASSED.setdefault(key, []).append(held)


def _same(held, value):
    kind, kept = held
    if kind == "ref":
        return kept() is value
    return type(kept) is type(value) and kept == value


def _passed_before(key, given):
    """True if this check passed before, in this process, with these very objects."""
    return any(len(held) == len(given) and all(map(_same, held, given))
               for held in _PASSED.get(key, ()))


@contextlib.contextmanager
def reuse_passes():
    """Within it, a check that already passed with the same objects returns at once. Yields
    {"reused": names of the checks so answered, "run": names of those run}."""
    calls = {"reused": [], "run": []}
    token = _REUSING.set(calls)
    try:
        yield calls
    finally:
        _REUSING.reset(token)
