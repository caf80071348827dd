"""Calling a student's formula of lesson 01 in this process, and reading what it returned: the
three checks' shared pieces (`count_gpt_params.py`, `zero_model_state.py`,
`mlp_activation_bytes.py`).
"""

import functools
import numbers

from dlcourse.checks.core import call_in_process, fail
from dlcourse.checks.memory.answers import ANSWERS
from dlcourse.checks.memory.in_rank import no_modules


def answer(fn, args, *, exercise, where, forbidden=(), why=""):
    """fn(*args), with building a module, each of `forbidden` and the set's check functions
    refused while it runs (`core/answers.py`); any error it raises becomes a CheckFailed that names
    the case."""
    __tracebackhide__ = True
    answers = ANSWERS.but(single=tuple(("dlcourse.memory", f.__name__) for f in forbidden),
                          also=(functools.partial(no_modules, why),), why=why)
    return call_in_process(fn, args, exercise=exercise, where=where, guard=answers.in_process)


def expect_number(got, *, where, unit, hint=""):
    """Fail unless `got` is a plain number (int or float, not a bool, a tensor or None)."""
    __tracebackhide__ = True
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(where, None, f"returned {kind_of(got)}, expected a number of {unit}", hint)


def kind_of(value):
    return "None" if value is None else f"a value of type {type(value).__name__}"


def num(x):
    """12,345 for whole numbers, 12,345.67 otherwise: how the messages print bytes and counts."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"
