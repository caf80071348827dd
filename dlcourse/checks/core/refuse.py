"""Refusing the answer while a student's function runs, however the student reaches it.

A check that asks for `ring_all_reduce` or `model_state_bytes` must not pass a function that
calls the library's own. The answer is refused by its code, so every way to it refuses (all
undone when the check ends):
- `replaced(namespaces, [(library_function, refusal(...))])`: the library function's code is
  swapped for code that raises `ForbiddenCall`. Every name, alias, default argument or module
  that holds the function holds the same function object, so every one of them now refuses; the
  names bound to other objects (a class, a table) in `namespaces` are rebound to the stand-in.
- A copy of the function made before the check (`types.FunctionType(f.__code__, ...)`, or one
  rebuilt by pickling) is found by `Refused.copies_in(fn)`, which follows what the student's
  function refers to and compares code objects.
- A copy made while the student's code runs (the library file's text read and exec'd, the module
  reloaded) is refused when it is called (`copies_refused`, a profile hook). A copy with a line
  changed is the student's own code, as the lesson's code typed into the notebook would be: no
  grader can tell those apart.
Both ways of finding copies follow a function the same way, `functions_reached`. What a rank may
use to communicate is refused apart, in `communication.py`.
"""

import contextlib
import sys
import threading
import types


class ForbiddenCall(RuntimeError):
    """Raised inside a rank when the student calls a function the exercise forbids."""


def refusal(what, why, verb="called"):
    """A stand-in that raises ForbiddenCall: '<verb> <what>, which this exercise does not
    allow: <why>'. Its `message` is what it says."""
    message = f"{verb} {what}, which this exercise does not allow: {why}"
    refuse = types.FunctionType(_refusing_code(_raise_forbidden, message), {}, "refuse")
    refuse.message = message  # no closure: a copy of the stand-in refuses too
    return refuse


def _raise_forbidden(*args, **kwargs):  # its code, with the message swapped in, is what runs
    raise __import__("dlcourse.checks.core.refuse", fromlist=["ForbiddenCall"]).ForbiddenCall(
        "MESSAGE")


def _refusing_code(original, message):
    code = _raise_forbidden.__code__
    consts = tuple(message if c == "MESSAGE" else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_name=original.__code__.co_name,
                        co_qualname=original.__code__.co_qualname)


class Refused:
    """What a `replaced` block refuses: the library functions' original code objects."""

    def __init__(self):
        self.codes = []  # [(original code object, message)]

    def copies_in(self, fn, depth=3):
        """The message of a refused function that `fn` holds a copy of (a function object with
        the same code that is not the swapped original), or None. For a class (a student's
        autograd Function), what its own methods hold."""
        seen = set()
        roots = ([getattr(a, "__func__", a) for a in vars(fn).values()]
                 if isinstance(fn, type) else [fn])
        for code in (f.__code__ for root in roots for f in functions_reached(root, depth, seen)):
            for original, message in self.codes:
                if code is original or _same_function(code, original):
                    return message
        return None


def _same_function(code, original):
    """A copy compiled from the library's text: equal code (Python's `==` on code objects
    leaves out the qualified name) under the original's qualified name. A student's own
    one-line method in a class of another name is theirs, even where it is written as the
    lesson wrote it and happens to start on the same line (`return grad, None`)."""
    return code == original and code.co_qualname == original.co_qualname


@contextlib.contextmanager
def replaced(namespaces, replacements):
    """While the block runs, each `replacements` original refuses: a function by its code, and
    every name in `namespaces` (module dicts, a student's globals) bound to one is bound to its
    stand-in; then all is put back. Yields a `Refused` (for `copies_in` and `copies_refused`).

    replacements: [(original object, stand-in)], matched by identity.
    """
    stand_ins = {id(original): stand_in for original, stand_in in replacements}
    saved = [(ns, key, value) for ns in namespaces for key, value in list(ns.items())
             if id(value) in stand_ins]
    refused, swapped, seen = Refused(), [], set()
    for original, stand_in in replacements:
        message = getattr(stand_in, "message", None)
        if id(original) in seen:  # listed twice: swapping again would save the refusing code
            continue
        seen.add(id(original))
        if isinstance(original, types.FunctionType) and message and not original.__closure__:
            refused.codes.append((original.__code__, message))
            swapped.append((original, original.__code__))
            original.__code__ = _refusing_code(original, message)
    for ns, key, value in saved:
        ns[key] = stand_ins[id(value)]
    try:
        yield refused
    finally:
        for ns, key, value in saved:
            ns[key] = value
        for original, code in reversed(swapped):
            original.__code__ = code


# ---------------------------------------------------------------- the one walker


def functions_reached(fn, depth, seen=None, classes=False):
    """The functions `fn` reaches, itself first: the globals its code (and the code nested in it)
    names, its defaults and its closure cells, `depth` references deep, each once (`seen`, shared
    between calls). With `classes`, through a class too: the functions it defines (static and
    class methods, property getters)."""
    seen = set() if seen is None else seen
    if id(fn) in seen or depth < 0:
        return
    if classes and isinstance(fn, type) and fn.__module__ != "builtins":
        seen.add(id(fn))
        for attr in vars(fn).values():
            member = getattr(attr, "fget", getattr(attr, "__func__", attr))
            yield from functions_reached(member, depth - 1, seen, classes)
        return
    if not isinstance(fn, types.FunctionType):
        return
    seen.add(id(fn))
    yield fn
    refs = [fn.__globals__.get(name) for name in _names(fn.__code__)]
    refs += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    refs += [cell.cell_contents for cell in fn.__closure__ or () if _filled(cell)]
    for ref in refs:
        yield from functions_reached(ref, depth - 1, seen, classes)


def _names(code):
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- copies made while it runs


@contextlib.contextmanager
def copies_refused(refused, fn=None):
    """While the block runs, calling a function whose code is a refused original's (equal but
    for its first line's number: a copy compiled while the student's code runs, e.g. from the
    library file's text) raises ForbiddenCall with the original's message. The code objects of
    the student's own `fn` (what it refers to, the functions it nests) are the student's, never
    a copy: a one-line method may well be written as the lesson wrote it (`copies_in` judges
    those). A profile hook on this thread and on threads started in the block; then undone."""
    by_name = {}
    for code, message in (refused.codes if isinstance(refused, Refused) else ()):
        by_name.setdefault(code.co_name, []).append((code, message))
    if not by_name:
        yield
        return
    own = {id(c) for f in functions_reached(fn, 4, classes=True) for c in _nested(f.__code__)}

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in by_name and id(frame.f_code) not in own:
            for code, message in by_name[frame.f_code.co_name]:
                if frame.f_code.replace(co_firstlineno=code.co_firstlineno) == code:
                    raise ForbiddenCall(message)

    before, before_threads, named = sys.getprofile(), threading.getprofile(), sys.setprofile
    _SETPROFILE(profile)
    threading.setprofile(profile)
    # the hook stays on: `sys.setprofile(None)` first would let a copy run (ctypes still could)
    sys.setprofile = refusal("sys.setprofile", "the check watches the calls your code makes")
    try:
        yield
    finally:
        sys.setprofile = named  # a block inside another puts back the outer one's refusal
        _SETPROFILE(before)
        threading.setprofile(before_threads)


_SETPROFILE = sys.setprofile  # torch's own, whatever a block has bound to the name


def _nested(code):
    """`code` and every code object nested in it (its inner functions, lambdas, classes)."""
    found, codes = [], [code]
    while codes:
        code = codes.pop()
        found.append(code)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found
