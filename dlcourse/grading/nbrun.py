"""Run one notebook under nbval, in a fresh kernel, within a time limit per cell and per
notebook; return what happened to each code cell (`dlcourse grade`, `tests/test_exercises.py`).

nbval interrupts a cell past its limit. Past the notebook's limit we kill pytest, the kernel and
everything the kernel started (ranks included); the `nbresults` plugin has already written the
cells that finished, so they still count.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

CELL_TIMEOUT_S = 60.0  # a grader cell runs a few short launches; a minute means a stuck cell
NOTEBOOK_TIMEOUT_S = 300.0  # kernel start + every cell; an exercise notebook takes ~10 s


def run_cells(path, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S, nb=None):
    """Run every cell of the notebook at `path` (or of `nb`, written to a temporary folder under
    the same name and run there) under nbval. Returns
    ({code cell index: {"outcome": "passed" | "failed" | "skipped", "reason": ...}}, problem),
    `problem` being "" or why the run as a whole fell short (time limit, pytest failure)."""
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="dlcourse-grade-") as tmp:
        if nb is not None:
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
        returncode, output = _run_with_limit(command, notebook_timeout)
        cells = _read_results(results)
    if returncode is None:
        return cells, f"not reached: the notebook ran past its {notebook_timeout:g} s time limit"
    if returncode not in (0, 1) and not cells:  # pytest itself failed: usage, collection, ...
        tail = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        return cells, f"nbval could not run the notebook (pytest exit {returncode}): {tail[0]}"
    return cells, ""


def _run_with_limit(command, seconds):
    """Run `command`; return (exit code, output), or (None, output) if it ran past `seconds`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    # Only the plugins named on the command line: the others cost a second per notebook.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=seconds)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)
        output, _ = process.communicate()
        return None, output


def _kill_tree(pid):
    """SIGKILL `pid` and everything below it. jupyter_client starts the kernel in a session of
    its own, so a process-group kill would miss it (and the ranks it launched); /proc knows the
    whole family. Where there is no /proc, the kernel notices its parent is gone and exits."""
    family = [pid]
    children = _children_by_parent()
    for p in family:  # grows as we go: breadth-first over the tree
        family += children.get(p, [])
    for p in family:
        try:
            os.kill(p, signal.SIGKILL)
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
