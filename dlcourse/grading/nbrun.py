"""Run one notebook under nbval, in a fresh kernel, within a time limit per cell and per
notebook; return what happened to each code cell (`dlcourse grade`, `tests/test_exercises.py`).

nbval interrupts a cell past its limit. Past the notebook's limit we kill pytest, the kernel and
everything the kernel started (ranks included); the `nbresults` plugin has already written the
cells that finished, so they still count.
"""

import ctypes
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

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
        run = Run(tmp, path.parent, original.parent if sandbox else None)
        returncode, output = run(command, notebook_timeout)
        cells = _read_results(results)
        if after is not None:
            after(run)
    if returncode is None:
        return cells, f"not reached: the notebook ran past its {notebook_timeout:g} s time limit"
    if returncode not in (0, 1) and not cells:  # pytest itself failed: usage, collection, ...
        tail = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        return cells, f"nbval could not run the notebook (pytest exit {returncode}): {tail[0]}"
    return cells, ""


class Run:
    """Commands run in one temporary `folder` (the only place they can write), in the sandbox
    when `hide` (the submissions' folder) is given and bubblewrap works; `notebook_folder` is
    where the notebook's copy and its kernel's files are."""

    def __init__(self, folder, notebook_folder, hide):
        self.folder, self.notebook_folder, self.hide = folder, notebook_folder, hide

    def __call__(self, command, seconds, stdin=None):
        """(exit code, output) of `command`, or (None, output) past `seconds`."""
        if self.hide is not None and isolation() == BUBBLEWRAP:
            command = _in_bubblewrap(command, self.folder, hide=self.hide)
        return _run_with_limit(command, seconds, stdin)


BUBBLEWRAP, NONE = "bubblewrap", "none"


@functools.cache
def isolation():
    """How `run_cells(sandbox=True)` isolates a submission: "bubblewrap" where `bwrap` is
    installed (Debian: `apt-get install bubblewrap`) and works, else "none", said once."""
    bwrap = shutil.which("bwrap")
    works = bwrap and subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", *_not_root(),
                                      "true"], capture_output=True).returncode == 0
    if not works:
        print("dlcourse grade: WARNING: no sandbox (bubblewrap's `bwrap` is not installed or "
              "cannot make namespaces here), so a submission runs with the grader's rights: it "
              "could read other submissions or change files. Install bubblewrap to isolate "
              "each one.", file=sys.stderr)
    return BUBBLEWRAP if works else NONE


def _in_bubblewrap(command, folder, hide):
    """`command` in a sandbox (Linux namespaces through bubblewrap): its own PID namespace (it
    cannot see or signal the grader, and every process in it ends with it), no network but its
    own loopback (the ranks' rendezvous), the whole system read-only (the course package, the
    gradebook), the folder `hide` (the submissions) replaced by an empty one, a private /tmp and
    HOME, and `folder` (the notebook's copy and the results file) the only place it can write."""
    # the course package is bound back read-only after the private /tmp, where a clone may live
    return ["bwrap", "--ro-bind", "/", "/", *_hiding(hide), "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", "--ro-bind", _package(), _package(),
            "--bind", folder, folder,
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            *_not_root(),
            "--die-with-parent", "--new-session", "--setenv", "HOME", "/tmp",
            "--setenv", "JUPYTER_RUNTIME_DIR", "/tmp/jupyter", "--chdir", folder, "--", *command]


def _not_root():
    """bwrap arguments for a user namespace where the submission is not root: run by root,
    bubblewrap keeps every capability, and root regains them at each exec; an ordinary user id
    has none (so a rank cannot trace the verdict process, `dlcourse/checks/verdict.py`)."""
    return ["--unshare-user", "--uid", str(os.getuid() or 1000), "--gid", str(os.getgid() or 1000),
            "--cap-drop", "ALL"]


def _hiding(folder):
    """bwrap arguments that empty `folder`, unless Python itself lives inside it; the course
    package is put back (read-only) in case it did."""
    inside = [Path(sys.prefix).resolve(), Path(tempfile.gettempdir()).resolve()]
    if any(p == folder or folder in p.parents for p in inside):
        return []
    return ["--tmpfs", str(folder), "--ro-bind", _package(), _package()]


def _package():
    """The folder of the installed dlcourse package (an editable install's is the clone's)."""
    return str(Path(__file__).resolve().parents[1])


def _run_with_limit(command, seconds, stdin=None):
    """Run `command` (`stdin` text on its standard input); return (exit code, output), or
    (None, output) if it ran past `seconds`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    # Only the plugins named on the command line: the others cost a second per notebook.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.PIPE if stdin is not None else None,
                               text=True, env=env, start_new_session=True)
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
