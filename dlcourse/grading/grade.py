"""Grade submitted notebooks with nbval as the engine (`dlcourse grade`).

For each notebook, a fresh `python -m pytest --nbval-lax` runs every cell in order in its own
kernel, with a time limit per cell (nbval interrupts the kernel) and one for the whole notebook
(we kill pytest, its kernel and the kernel's ranks). The `nbresults` plugin writes one line per
cell; a grader cell that passed earns its points, any other earns 0 with the first line of why.

Whatever a submission does (crash the kernel, loop forever, fail to parse, not be a notebook,
lose its grader cells) it gets a `Submission` with the reason, and the next one is graded.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dlcourse.grading.notebooks import GraderMarkError, grader_cells, read

CELL_TIMEOUT_S = 60.0  # a grader cell runs a few short launches; a minute means a stuck cell
NOTEBOOK_TIMEOUT_S = 300.0  # kernel start + every cell; an exercise notebook takes ~10 s

# nbval's words for a cell it could not run, and what they mean to a student.
_NBVAL_REASONS = {
    "Kernel dead on test start": "not run: the kernel died in an earlier cell",
    "Previous cell timed out, expected cell to fail": "not run: an earlier cell ran out of time",
}


@dataclass
class Result:
    exercise: str
    points: int  # possible
    earned: int
    reason: str = ""  # empty when passed


@dataclass
class Submission:
    path: Path
    results: list = field(default_factory=list)  # one Result per exercise, notebook order
    notes: list = field(default_factory=list)  # what went wrong beyond the graders themselves
    readable: bool = True  # False: not a notebook at all, so nothing in it was graded

    @property
    def total(self):
        return sum(r.earned for r in self.results)

    @property
    def possible(self):
        return sum(r.points for r in self.results)


def find_notebooks(paths):
    """Notebooks named on the command line, and every notebook below a named folder, sorted."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return found


def grade_notebook(path, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S):
    """Run one notebook under nbval and score its grader cells."""
    submission = Submission(Path(path))
    try:
        graders = grader_cells(read(path))
    except (ValueError, GraderMarkError) as error:
        submission.notes.append(str(error))
        submission.readable = False
        return submission
    if not graders:  # nothing to score, so nothing to run
        submission.notes.append("no grader cells (a grader cell has metadata "
                                '{"dlcourse": {"grader": ..., "points": ...}}): were they deleted?')
        return submission
    cells, problem = run_cells(Path(path), cell_timeout, notebook_timeout)
    if problem:
        submission.notes.append(problem)
    for g in graders:
        cell = cells.get(g.code_cell)
        if cell is None:
            reason = problem or "not run"
        elif cell["outcome"] == "passed":
            reason = ""
        else:
            reason = _NBVAL_REASONS.get(cell["reason"], cell["reason"]) or cell["outcome"]
        submission.results.append(Result(g.exercise, g.points, 0 if reason else g.points, reason))
    submission.notes += _failed_other_cells(cells, {g.code_cell for g in graders})
    return submission


def _failed_other_cells(cells, grader_indices):
    """The first failing cell that is not a grader: often why the graders failed (a syntax error
    leaves the function undefined, and its grader says NameError)."""
    for index in sorted(cells):
        cell = cells[index]
        if index not in grader_indices and cell["outcome"] != "passed":
            reason = _NBVAL_REASONS.get(cell["reason"], cell["reason"])
            return [f"code cell {index} failed: {reason}"]
    return []


def run_cells(path, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S):
    """Run every cell of one notebook under nbval in a fresh kernel. Returns
    ({code cell index: {"outcome": "passed" | "failed" | "skipped", "reason": ...}}, problem),
    `problem` being "" or why the run as a whole fell short (time limit, pytest failure)."""
    with tempfile.TemporaryDirectory(prefix="dlcourse-grade-") as tmp:
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
