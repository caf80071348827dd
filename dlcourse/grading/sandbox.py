"""The sandbox a submission runs in while `dlcourse grade` grades it (`nbrun.Run`): bubblewrap's
Linux namespaces where `bwrap` is installed, nothing (and a warning) where it is not.

Inside it the whole system is read-only, /tmp, /dev/shm and the submissions' folder are empty,
and the notebook's own temporary folder is the only place it can write. What the kernel needs
to start is put back, read-only, over those empty folders: the course package and the Python
that runs the grading (its prefixes, its executable's folder, every `sys.path` entry), since a
venv or a clone under /tmp is common and a kernel that cannot start would grade a whole class 0.
"""

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

BUBBLEWRAP, NONE = "bubblewrap", "none"
SHARED_TMP = "bubblewrap, ranks sharing /tmp"  # the sandbox, but no rank sandbox inside it


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
    if works and not _ranks_sandboxed(bwrap):
        print("dlcourse grade: WARNING: the ranks of a graded job share one /tmp (a process in "
              "the sandbox cannot make a namespace of its own here), so they could pass data "
              "through files.", file=sys.stderr)
    return BUBBLEWRAP if works else NONE


def described():
    """The gradebook's `isolation` column: "none", "bubblewrap", or "bubblewrap, ranks sharing
    /tmp" where a rank cannot make a namespace of its own inside it (`rank_sandbox.py`): its
    ranks could then pass data through files, and read the answers' files (their modules are
    still absent from the ranks' memory: `absent.py`)."""
    if isolation() != BUBBLEWRAP:
        return NONE
    return BUBBLEWRAP if _ranks_sandboxed(shutil.which("bwrap")) else SHARED_TMP


@functools.cache
def _ranks_sandboxed(bwrap):
    """True where a process inside the sandbox can make the namespaces that each rank of a
    graded job makes (`rank_sandbox.py`): nested user namespaces allowed."""
    nested = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10020000) != 0)"
    return subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", *_not_root(),
                           sys.executable, "-c", nested], capture_output=True).returncode == 0


def in_bubblewrap(command, folder, hide):
    """`command` in a sandbox (Linux namespaces through bubblewrap): its own PID namespace (it
    cannot see or signal the grader, and every process in it ends with it), no network but its
    own loopback (the ranks' rendezvous), the whole system read-only (the course package, the
    gradebook), the folder `hide` (the submissions) replaced by an empty one, a private /tmp and
    HOME, and `folder` (the notebook's copy and the results file) the only place it can write."""
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            *_mounts(Path(folder), Path(hide)),
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            *_not_root(),
            "--die-with-parent", "--new-session", "--setenv", "HOME", "/tmp",
            "--setenv", "JUPYTER_RUNTIME_DIR", "/tmp/jupyter", "--chdir", str(folder),
            "--", *command]


def _mounts(folder, hide):
    """bwrap arguments: /tmp, /dev/shm and `hide` emptied, then what must stay visible inside
    them bound back (Python and the course package read-only, `folder` writable). bwrap mounts
    in order, a later mount over an earlier one, so parents go first: a venv inside the
    submissions' folder is bound back over its emptied parent, a submissions' folder inside a
    bound-back folder is emptied over it."""
    emptied = [Path("/tmp"), Path("/dev/shm"), hide.resolve()]
    mounts = [("--tmpfs", path) for path in emptied]
    mounts += [("--ro-bind", path) for path in needed_by_python() + [Path(package())]
               if any(root in path.parents for root in emptied)  # else it is visible already
               and not _shows_emptied(path, emptied)]
    mounts.append(("--bind", folder))
    mounts.sort(key=lambda mount: len(mount[1].parts))  # stable: at one depth, in the order above
    args = []
    for kind, path in mounts:
        args += [kind, str(path)] if kind == "--tmpfs" else [kind, str(path), str(path)]
    return args


def _shows_emptied(path, emptied):
    """True where binding `path` back would show what an emptied folder hides: it is one of
    them, or holds one (the submissions' folder, the cwd of `dlcourse grade .`), or is a
    symlink to such a place."""
    real = path.resolve()
    return any(real == root or real in root.parents for root in emptied)


def needed_by_python():
    """The folders (and zip files) this interpreter runs from, each as written and as its
    symlinks resolve: its prefixes (a venv's and the base one), its executable's folder and every
    existing `sys.path` entry (site-packages, an editable install's source, PYTHONPATH). A kernel
    or a checking process started with `sys.executable` needs them all."""
    written = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
               os.path.dirname(sys.executable), *sys.path]
    paths = []
    for entry in filter(None, written):
        for path in (Path(os.path.abspath(entry)), Path(entry).resolve()):
            if path.exists() and path not in paths:
                paths.append(path)
    return paths


def _not_root():
    """bwrap arguments for a user namespace where the submission is not root: run by root,
    bubblewrap keeps every capability, and root regains them at each exec; an ordinary user id
    has none (so a rank cannot trace the verdict process, `dlcourse/checks/core/verdict.py`)."""
    return ["--unshare-user", "--uid", str(os.getuid() or 1000), "--gid", str(os.getgid() or 1000),
            "--cap-drop", "ALL"]


def package():
    """The folder of the installed dlcourse package (an editable install's is the clone's)."""
    return str(Path(__file__).resolve().parents[1])
