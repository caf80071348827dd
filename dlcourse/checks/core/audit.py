"""An audit hook that keeps the refusals on while a student's code runs (issue 36).

`refuse.copies_refused` refuses a copy of a refused function through a profile hook, and a
profile hook can be switched off: `sys.setprofile(None)`, `cProfile`, or `ctypes` calling
`PyEval_SetProfile` or writing the interpreter's memory. An audit hook (PEP 578,
`sys.addaudithook`) cannot be removed once added, and Python raises an audit event before each
of those acts. So, while a frame of `student_runs` is on any thread's stack (the student's
function, or its unpickling, is running), this hook refuses:
- every `ctypes` event (loading a library, finding a symbol, reading or writing memory);
- `sys.setprofile` (from Python, from C through `PyEval_SetProfile`, or cProfile's);
- a socket of its own (an abstract UNIX socket or a TCP connection between ranks carries data
  past every count) and a new process (which no audit hook watches);
- making a function of a refused original's very code object, or giving it to a function (an
  original found through `gc`); exec'ing code that is, or holds, a copy of one under the same
  qualified name (the library file's text compiled and exec'd). A function rebuilt from code
  equal to an original's is left to `refuse.py`: the student's own one-line method may be
  written as the lesson wrote it.
What decides is the call stack, which the student's code cannot pop, and the hook's own
defaults, which it refuses to let anyone change; it reads no global and no builtin.
"""

import sys
import types

from dlcourse.checks.core.refuse import ForbiddenCall


def student_runs(fn, args, kwargs, originals):
    """fn(*args, **kwargs) with this process's audit hook armed; `originals` is a tuple of
    (code object, message): the refused functions' code (`Refused.codes`)."""
    __tracebackhide__ = True  # a student's traceback shows their code, not this frame
    return fn(*args, **kwargs)


def _hook(event, args, mark=student_runs.__code__, frames=sys._current_frames,
          code_type=types.CodeType, function_type=types.FunctionType, refusal=ForbiddenCall,
          own=()):
    # No global and no builtin is read here (`type`, `isinstance` could be rebound): only the
    # defaults, which the first lines refuse to let anyone change.
    if event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
        for protected in own:
            if args[0].__class__ is function_type and args[0].__code__ is protected:
                raise refusal(f"changed {args[1]} of the checks' audit hook")
    if not event.startswith("ctypes.") and event not in ("sys.setprofile", "exec",
                                                         "function.__new__", "object.__setattr__",
                                                         "socket.__new__", "subprocess.Popen",
                                                         "os.system", "os.exec", "os.posix_spawn",
                                                         "os.fork"):
        return
    originals = None
    for frame in frames().values():  # armed where a frame of `student_runs` is on a stack
        while frame is not None and originals is None:
            if frame.f_code is mark:
                originals = frame.f_locals["originals"]
            frame = frame.f_back
    if originals is None:
        return
    if event.startswith("ctypes.") or event == "sys.setprofile":
        raise refusal(f"used {event}, which no exercise allows: the check watches the calls "
                      "your code makes, and ctypes could switch that off")
    if not event.startswith(("exec", "function.", "object.")):
        raise refusal(f"used {event}, which no exercise allows: ranks talk through "
                      "torch.distributed, and a socket or a process of your own would not")
    if event != "exec":  # a function made of, or given, an original's very code (from gc)
        code = args[2] if event == "object.__setattr__" else args[0]
        for original, message in originals:
            if code is original:
                raise refusal(message)
        return
    codes, found = [args[0]], []
    while codes:  # exec'd: the code and every code nested in it (a module's functions), equal
        code = codes.pop(0)  # to an original's but for its first line, and named as it is (the
        # library file's text): a module the student's code imports may hold a one-line method
        # written as the lesson wrote it, in a class of its own name
        if code.__class__ is not code_type:
            continue
        for original, message in originals:
            if code.co_qualname == original.co_qualname and \
                    code.replace(co_firstlineno=original.co_firstlineno) == original:
                found += [(original.co_qualname, message)]
        codes += [c for c in code.co_consts if c.__class__ is code_type]
    if found[1:]:  # a copy of a whole file: every refused function in it, in the file's order
        first, message = found[0]
        names = ", ".join([name for name, _ in found])
        raise refusal(message.replace(f"called {first} ", f"exec'd a copy of {names} ", 1))
    if found:
        raise refusal(found[0][1])


def _install():
    """Add the hook once, its `own` default naming the codes it protects."""
    hook = types.FunctionType(_hook.__code__, {}, "dlcourse_audit_hook",
                              _hook.__defaults__[:-1] + ((_hook.__code__,
                                                          student_runs.__code__),))
    sys.addaudithook(hook)


_install()
