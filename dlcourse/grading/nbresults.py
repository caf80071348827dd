"""A pytest plugin that `dlcourse grade` loads next to nbval: it writes one JSON line per notebook
cell nbval ran, so the grader can turn cells into points (see `dlcourse/grading/grade.py`).

    python -m pytest --nbval-lax -p dlcourse.grading.nbresults --dlcourse-results FILE nb.ipynb

Each line is {"cell": <code cell index>, "outcome": "passed" | "failed" | "skipped",
"reason": <first line of the failure>, "kernel": <False where the kernel never started>}. Lines are flushed as they are written, so the cells that
finished before the notebook ran out of time are still there when the grader kills the run.

It also makes nbval notice a dead kernel at once. nbval waits for a cell's reply for the whole
cell time limit even when the student's code has crashed the kernel; the wrapper below waits in
one-second slices and gives up as soon as the kernel process is gone.
"""

import json
import os
import time
from queue import Empty

import pytest
from nbval.kernel import RunningKernel
from nbval.plugin import IPyNbCell

from dlcourse.grading import nbrun
from dlcourse.grading.text import trim

POLL_S = 1.0  # how often a waiting cell checks that the kernel is still alive


class KernelDied(RuntimeError):
    """The kernel process exited while a cell was running."""


def pytest_addoption(parser):
    parser.addoption("--dlcourse-results", metavar="FILE",
                     help="write one JSON line per notebook cell result to FILE (dlcourse grade)")


def pytest_configure(config):
    path = config.getoption("dlcourse_results")
    if path:
        config._dlcourse_results = open(path, "a", encoding="utf-8")
        _watch_for_dead_kernels()
        # Orphans of the notebook's processes (a double fork, a `setsid`) become ours, so that
        # the end of the run can end them: nothing a submission starts outlives its grading.
        config._dlcourse_reaper = nbrun.become_subreaper()


def pytest_unconfigure(config):
    results = getattr(config, "_dlcourse_results", None)
    if results is not None:
        results.close()
    if getattr(config, "_dlcourse_reaper", False):
        nbrun.end_family(os.getpid(), include_root=False)
        _reap()


def _reap():
    """Collect the exit status of every child that has ended, so none is left a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    results = getattr(item.config, "_dlcourse_results", None)
    # One line per cell: its "call" phase, or its "setup" phase if it never got that far.
    if results is not None and isinstance(item, IPyNbCell):
        if call.when == "call" or (call.when == "setup" and report.outcome != "passed"):
            outcome = report.outcome
            # A cell that raised did not pass, whatever a NBVAL_RAISES_EXCEPTION mark says: a
            # student could otherwise add one to a grader cell.
            if outcome == "passed" and _error_output(item) is not None:
                outcome = "failed"
            line = {"cell": item.cell_num, "outcome": outcome,
                    "reason": _reason(item, call, report, outcome),
                    "kernel": item.parent.kernel is not None}  # False: it never started
            results.write(json.dumps(line) + "\n")
            results.flush()
    return report


def _error_output(item):
    return next((o for o in item.test_outputs or [] if o.get("output_type") == "error"), None)


def _reason(item, call, report, outcome):
    """The first line a student or instructor needs: the cell's exception, as the kernel said it."""
    if outcome == "passed":
        return ""
    error = _error_output(item)
    if error is not None and error.get("ename") != "KeyboardInterrupt":
        return reason_of(error['ename'], error['evalue'])
    if call.excinfo is not None:  # a timeout (nbval interrupted the kernel), a dead kernel
        return _first_line(str(call.excinfo.value))
    # nbval's own reason, e.g. its mark on every cell after a timed-out one.
    return _first_line(getattr(report, "wasxfail", "") or report.longreprtext)


HINT_WIDTH = 200  # characters of a check's hint the gradebook keeps after the failure's line


def reason_of(ename, evalue):
    """The gradebook's line for an exception, as a kernel or the verdict process reports it: its
    first line, and the check's "Hint: ..." line (trimmed at a word) where the message has one."""
    reason = _first_line(f"{ename}: {evalue}")
    hint = next((line.strip() for line in str(evalue).splitlines()[1:]
                 if line.startswith("Hint: ")), "")
    return f"{reason} {trim(hint, HINT_WIDTH)}" if hint else reason


def _first_line(text):
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _watch_for_dead_kernels():
    original = RunningKernel.get_message
    if getattr(original, "_dlcourse_watch", False):
        return

    def get_message(self, stream, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_S if end is None else min(POLL_S, end - time.monotonic())
            try:
                return original(self, stream, timeout=max(left, 0.0))
            except Empty:
                if not self.is_alive():
                    raise KernelDied("the kernel died while running this cell (the code "
                                     "crashed it or exited the process)") from None
                if end is not None and time.monotonic() >= end:
                    raise

    get_message._dlcourse_watch = True
    RunningKernel.get_message = get_message
