"""A copy of a refused function made while the student's code runs (the library file's text read
and exec'd, the module reloaded) refused when it is called: `refuse.replaced` swaps the
originals' code, and `Refused.copies_in` finds the copies the student's function holds before it
runs; this finds the ones made after. A copy with a line changed is the student's own code, as
the lesson's code typed into the notebook would be: no grader can tell those apart.
"""

import contextlib
import sys
import threading
import types

from dlcourse.checks.core.refuse import ForbiddenCall, Refused, _filled, _names, refusal


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
    own = {id(c) for c in _own_codes(fn)}

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


def _own_codes(fn, depth=4):
    """The code objects of the student's `fn`, of the functions and classes (their methods) it
    refers to by globals, defaults and closures, `depth` references deep, and every code nested
    in them."""
    seen, found, objects = set(), [], [(fn, depth)]
    while objects:
        obj, left = objects.pop()
        if id(obj) in seen or left < 0:
            continue
        seen.add(id(obj))
        if isinstance(obj, type) and obj.__module__ not in ("builtins",):
            objects += [(getattr(a, "fget", getattr(a, "__func__", a)), left - 1)
                        for a in vars(obj).values()]
        elif isinstance(obj, types.FunctionType):
            codes = [obj.__code__]
            while codes:
                code = codes.pop()
                found.append(code)
                codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
            refs = [obj.__globals__.get(n) for n in _names(obj.__code__)]
            refs += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            refs += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
            objects += [(r, left - 1) for r in refs]
    return found
