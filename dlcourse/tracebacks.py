"""Tracebacks a student reads: their own cell and the message, not the course's frames.

IPython hides a frame that sets `__tracebackhide__ = True`, except the innermost one: the frame
that raised is always shown, and for a grader that is a line of `dlcourse/checks/`. An exception
that has a `_render_traceback_()` method is shown by what that method returns instead (IPython's
protocol, also used by ipyparallel): `student_traceback` renders it with IPython's own formatter
(colours, context lines, chained causes) from the frames outside this package. `%debug` and
`sys.last_traceback` still have every frame.
"""

import functools
import os
import types

COURSE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def student_traceback(error):
    """IPython's rendering of `error` (a list of lines) without the course's frames."""
    tb = _student_frames(error.__traceback__)
    try:
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:  # not in IPython: plain Python's rendering of the same frames
        import traceback
        return traceback.format_exception(type(error), error, tb)
    return shell.InteractiveTB.structured_traceback(type(error), error, tb, tb_offset=0)


def interrupted(message):
    """A KeyboardInterrupt (still named so: nbclient, nbval and the grader look for that name)
    that IPython shows as the student's cell and `message`."""
    error = KeyboardInterrupt(message)
    error._render_traceback_ = functools.partial(student_traceback, error)
    return error


def _student_frames(tb):
    """The traceback `tb` with the course's frames and hidden ones (`__tracebackhide__`, which
    IPython's own bottom frame sets too) left out; None if nothing is left."""
    kept = []
    while tb is not None:
        frame = tb.tb_frame
        if not (frame.f_code.co_filename.startswith(COURSE_DIR)
                or frame.f_locals.get("__tracebackhide__")):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt
