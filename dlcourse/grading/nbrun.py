"""Run one notebook under nbval, in a fresh kernel, within a time limit per cell and per
notebook; return what happened to each code cell (`dlcourse grade`, `tests/test_exercises.py`).

nbval interrupts a cell past its limit. Past the notebook's limit we kill pytest, the kernel and
everything the kernel started (ranks included); the `nbresults` plugin has already written the
cells that finished, so they still count.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from dlcourse.grading.sandbox import BUBBLEWRAP, in_bubblewrap, isolation

CELL_TIMEOUT_S = 60.0  # a grader cell runs a few short launches; a minute means a stuck cell
NOTEBOOK_TIMEOUT_S = 300.0  # kernel start + every cell; an exercise notebook takes ~10 s


def run_cells(path, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S, nb=None,
              sandbox=False, after=None):
    """Run every cell of the notebook at `path` (or of `nb`, written to a temporary folder under
    the same name and run there) under nbval. Returns
    ({code cell index: {"outcome": "passed" | "failed" | "skipped", "reason": ...}}, problem),
    `problem` being "" or why the run as a whole fell short (time limit, pytest failure).
    `sandbox`: run it in `isolation()`'s sandbox, which sees only a copy of the notebook.
    `after(run)`, if given, is called before the temporary folder goes, with a `Run` that can
    start more commands in the same sandbox and folder (the graders' verdicts)."""
    path = original = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="dlcourse-grade-") as tmp:
        if nb is not None or sandbox:
            nb = nb if nb is not None else nbformat.read(str(path), as_version=4)
            path = Path(tmp, "run", path.name)
            path.parent.mkdir()
            nbformat.write(nb, str(path))
        ini, results = Path(tmp, "pytest.ini"), Path(tmp, "cells.jsonl")
        ini.write_text("[pytest]\n")  # our settings only, not those of a project around `path`
        command = [
            sys.executable, "-m", "pytest", "-q", "-c", str(ini), "--rootdir", str(path.parent),
            "-p", "no:cacheprovider", "--noconftest", "-p", "nbval.plugin",
            "-p", "dlcourse.grading.nbresults", "--dlcourse-results", str(results),
            "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout:g}",
            str(path),
        ]
        run = Run(tmp, path.parent, original.parent if sandbox else None,
                  language=edition_of(original))
        returncode, output = run(command, notebook_timeout)
        cells = _read_results(results)
        if after is not None:
            after(run)
    if returncode is None:
        return cells, f"not reached: the notebook ran past its {notebook_timeout:g} s time limit"
    if not cells:  # pytest, or the sandbox around it, failed before any cell: see `no_cell_ran`
        tail = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        return cells, f"{NO_CELL_RAN} (pytest exit {returncode}): {tail[0]}"
    return cells, ""


NO_CELL_RAN = "nbval ran no cell"


def no_cell_ran(cells, problem):
    """True where nothing of the notebook ran: no cell's result came back, or every result says
    the kernel never started. Not a submission's doing as a rule (its code runs only in a kernel
    that started), so `dlcourse grade` then checks the machine (`grade.CannotGrade`)."""
    return problem.startswith(NO_CELL_RAN) or not any(c.get("kernel") for c in cells.values())


class Run:
    """Commands run in one temporary `folder` (the only place they can write), in the sandbox
    when `hide` (the submissions' folder) is given and bubblewrap works; `notebook_folder` is
    where the notebook's copy and its kernel's files are."""

    def __init__(self, folder, notebook_folder, hide, language=None):
        self.folder, self.notebook_folder, self.hide = folder, notebook_folder, hide
        self.language = language  # DLCOURSE_LANG for the kernel and the verdicts, if set

    def __call__(self, command, seconds, stdin=None):
        """(exit code, output) of `command`, or (None, output) past `seconds`."""
        if self.hide is not None and isolation() == BUBBLEWRAP:
            command = in_bubblewrap(command, self.folder, hide=self.hide)
        return _run_with_limit(command, seconds, stdin, self.language)


def edition_of(notebook):
    """"zh" for a notebook of lessons/zh/ or exercises/zh/ when DLCOURSE_LANG is not set: its
    hints and "not written yet" lines are graded in Chinese, as they run (dlcourse/i18n/)."""
    chinese = Path(notebook).parent.name == "zh" and "DLCOURSE_LANG" not in os.environ
    return "zh" if chinese else None


def _run_with_limit(command, seconds, stdin=None, language=None):
    """Run `command` (`stdin` text on its standard input); return (exit code, output), or
    (None, output) if it ran past `seconds`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    if language:
        env["DLCOURSE_LANG"] = language
    # Only the plugins named on the command line: the others cost a second per notebook.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.PIPE if stdin is not None else None,
                                   text=True, env=env, start_new_session=True)
    except OSError as error:  # no such interpreter: as a shell says it, exit 127
        return 127, f"{command[0]}: {error}"
    try:
        output, _ = process.communicate(stdin, timeout=seconds)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)
        output, _ = process.communicate()
        return None, output


def _kill_tree(pid):
    """SIGKILL `pid` and everything below it (see `end_family`)."""
    end_family(pid)


def end_family(pid, include_root=True):
    """SIGKILL every process below `pid` (and `pid` itself with `include_root`), leaving none.

    jupyter_client starts the kernel in a session of its own, so a process-group kill would miss
    it (and the ranks it launched); /proc knows the whole family. Each member is first stopped
    (SIGSTOP), so none can start another while we look, until a look finds no one new; then all
    are killed. A process that left its parent (a double fork, `setsid` and exit) is found too
    where the root is a subreaper (`become_subreaper`): Linux gives it the root as its parent.
    Where there is no /proc, the kernel notices its parent is gone and exits."""
    stopped = set()
    while True:
        new = _family(pid, include_root) - stopped
        if not new:
            break
        _signal_all(new, signal.SIGSTOP)
        stopped |= new
    _signal_all(stopped, signal.SIGKILL)
    return stopped


def become_subreaper():
    """Make this process the parent of every orphan below it (Linux PR_SET_CHILD_SUBREAPER): a
    submission's process that double-forks or calls `setsid` then stays in reach of
    `end_family(os.getpid())`. False where Linux does not offer it."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>


def _family(pid, include_root):
    children = _children_by_parent()
    family = [pid]
    for p in family:  # grows as we go: breadth-first over the tree
        family += children.get(p, [])
    return set(family) if include_root else set(family) - {pid}


def _signal_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _children_by_parent():
    children = {}
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else []:
        try:
            ppid = int(entry.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        children.setdefault(ppid, []).append(int(entry.parent.name))
    return children


def _read_results(path):
    cells = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short when the run was killed
            cells[record["cell"]] = record
    return cells
