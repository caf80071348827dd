"""Formula exercises: the student's function called in the checking process, inside the
exercise's guards (`call_in_process`, `call_each_in_process` for many cases); a submission's
code (`Submitted`, under `dlcourse grade`) on one rank instead, its answers read back as data.
Exercises that run on real ranks use `ranks.run_on_ranks`. The guide to the whole core is
`dlcourse/checks/core/__init__.py`.
"""

import contextlib

from dlcourse import pickling, returned
from dlcourse.checks.core.audit import student_runs
from dlcourse.checks.core.expect import CheckFailed, expect_callable
from dlcourse.checks.core.ranks import (CHECK_TIMEOUT_S, Submitted, explain_failure,
                                        graded_launch, named_stub, originals_of, refuse_copies)
from dlcourse.checks.core.refuse import ForbiddenCall, copies_refused
from dlcourse.checks.core.stubs import NotWritten, not_written
from dlcourse.errors import RankError, RankTimeout
from dlcourse.launcher import launch_as_data


def call_in_process(fn, args, *, exercise, where, guard=None, hint="", answer=None):
    """fn(*args) in the notebook's own process, for exercises that are formulas rather than
    ranks; `guard(fn)` (a function of the student's function that returns a context manager,
    e.g. `ANSWERS.in_process`) is active while it runs. What the student's function
    raises becomes a CheckFailed that names the case (and gives `hint`). A `Submitted` function
    (`dlcourse grade`) runs on one rank instead, its answer read back as data; `answer(value,
    *args)`, if given, turns the answer into data where it is computed (both ways alike)."""
    __tracebackhide__ = True  # IPython shows the student the check's message, not this frame
    expect_callable(fn, exercise)
    if isinstance(fn, Submitted):
        return _call_submitted(fn, args, exercise, where, guard, hint, answer)
    return _call(fn, args, exercise, where, guard, hint, answer)


# What the rank is sent in place of the case's name and hint, put back in its message here: a
# name can tell what the answer is ("rank 1's traces of X with bug 'b'"), and the rank is sent
# the arguments only, as `run_on_ranks`'s are.
_WHERE, _HINT = "\x00where\x00", "\x00hint\x00"


def _call_submitted(fn, args, exercise, where, guard, hint, answer):
    __tracebackhide__ = True
    try:
        options, guard = graded_launch(guard, "in_process", None)
        [value] = launch_as_data(_call_in_rank, fn.payload, args, exercise, _WHERE, guard,
                                 _HINT if hint else "", answer, world_size=1, backend="gloo",
                                 timeout=CHECK_TIMEOUT_S, **options)
        return value
    except RankTimeout:
        raise CheckFailed(f"{where}: did not return within {CHECK_TIMEOUT_S:g} s") from None
    except RankError as error:
        outcome = error.outcome
        if outcome is not None and outcome.raised(CheckFailed):
            message = outcome.message.replace(_WHERE, where).replace(_HINT, hint)
            raise CheckFailed(message) from None
        raise CheckFailed(explain_failure(exercise, where, hint, error)) from None


def _call_in_rank(payload, args, exercise, where, guard, hint, answer):
    """The rank's side of `_call_submitted`: the function loaded and called as `_call` would."""
    fn = student_runs(pickling.loads, (payload,), {}, ())  # the audit hook armed
    return _call(fn, args, exercise, where, guard, hint, answer)


def call_each_in_process(fn, cases, *, exercise, guard=None, hint="", answer=None):
    """`call_in_process` over many cases, [(args, where)]: yields each case's value in order,
    and raises the first case's CheckFailed where it comes, as the calls one by one would. A
    `Submitted` function runs every case on one rank in one launch (a formula exercise of 60
    cases: one launch, not 60), which stops at the first case that fails."""
    __tracebackhide__ = True
    expect_callable(fn, exercise)
    if not isinstance(fn, Submitted):
        for args, where in cases:
            yield _call(fn, args, exercise, where, guard, hint, answer)
        return
    wheres = [where for _, where in cases]
    for kind, value in _call_each_submitted(fn, [args for args, _ in cases], exercise, wheres,
                                            guard, hint, answer):
        if kind == "failed":
            raise CheckFailed(value)
        yield value


def _case_marker(i):
    return f"\x00where {i}\x00"


def _call_each_submitted(fn, args_list, exercise, wheres, guard, hint, answer):
    """[("value", v) | ("failed", message)] of the cases up to the first that fails, from one
    rank; the rank is sent markers in place of the cases' names (`_WHERE`'s reason)."""
    __tracebackhide__ = True
    where_all = f"{exercise} on {len(wheres)} cases"
    try:
        options, guard = graded_launch(guard, "in_process", None)
        [results] = launch_as_data(_call_each_in_rank, fn.payload, args_list, exercise, guard,
                                   _HINT if hint else "", answer, world_size=1, backend="gloo",
                                   timeout=CHECK_TIMEOUT_S * len(args_list), **options)
    except RankTimeout:
        raise CheckFailed(f"{where_all}: did not return within "
                          f"{CHECK_TIMEOUT_S * len(args_list):g} s") from None
    except RankError as error:
        raise CheckFailed(explain_failure(exercise, where_all, hint, error)) from None
    named = []
    for kind, value in results:
        if kind == "failed":
            for i, where in enumerate(wheres):
                value = value.replace(_case_marker(i), where)
            value = value.replace(_HINT, hint)
        named.append((kind, value))
    return named


def _call_each_in_rank(payload, args_list, exercise, guard, hint, answer):
    """The rank's side of `_call_each_submitted`: the function loaded once, each case called
    as `_call` would, up to the first that fails."""
    fn = student_runs(pickling.loads, (payload,), {}, ())  # the audit hook armed
    results = []
    for i, args in enumerate(args_list):
        try:
            value = _call(fn, args, exercise, _case_marker(i), guard, hint, answer)
        except CheckFailed as failed:
            results.append(("failed", str(failed)))
            break
        what = returned.not_data(value)  # named by its case, as one call's launch would
        if what is not None:
            results.append(("failed", f"{_case_marker(i)}: rank 0 returned {what}, "
                                      f"{returned.ONLY_DATA}"))
            break
        results.append(("value", value))
    return results


def _call(fn, args, exercise, where, guard, hint, answer=None):
    __tracebackhide__ = True
    try:
        with guard(fn) if guard else contextlib.nullcontext() as refused:
            refuse_copies(refused, fn)
            with copies_refused(refused, fn):
                value = student_runs(fn, args, {}, originals_of(refused))
        return returned.as_data(answer(value, *args) if answer else value)  # as `_in_rank`'s
    except ForbiddenCall as error:
        raise CheckFailed(f"{where}: {error}") from None
    except NotImplementedError as error:
        error = named_stub(error, getattr(fn, "__name__", None))
        if isinstance(error, NotWritten):
            raise CheckFailed(str(error)) from None
        if error.args and not str(error).startswith("Hint:"):  # torch's own: the student's bug
            raise CheckFailed(f"{where}: raised NotImplementedError: {error}") from error
        raise CheckFailed(not_written(exercise, str(error))) from None
    except Exception as error:  # the student's bug: show it, and their traceback under it
        raise CheckFailed(f"{where}: raised {type(error).__name__}: {error}"
                          + (f"\nHint: {hint}" if hint else "")) from error
