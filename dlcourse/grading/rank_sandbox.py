"""One sandbox per rank while `dlcourse grade` runs a submission's code on ranks (issue 36).

The grading sandbox (`sandbox.py`) keeps a submission away from the machine, but the ranks of
one job share it: rank 0 could write its shard to /tmp and rank 1 read it, with no message sent.
So each rank of an untrusted launch (`launcher.launch_as_data`) makes, as its first act, a mount
namespace of its own (inside a user namespace, so no privilege is needed), where:
- /tmp and /dev/shm are new, empty and private; the folder the job was started in (the notebook's
  copy, the one writable folder of the grading sandbox) is hidden under them;
- what Python needs that lay under them (a venv or a clone under /tmp) is bound back read-only;
- /proc shows this rank's own process only, so no rank reaches another's files through
  `/proc/<pid>/root` or `/proc/<pid>/cwd`;
- `hide` (the files of the modules that answer the exercise, `Answers.hidden`) cannot be read:
  /dev/null is bound over each, on a mount where devices do not open.
The network namespace is the launch's: gloo's TCP connections on loopback work as before.

It is Linux's `unshare(CLONE_NEWUSER | CLONE_NEWNS)`, which a process may call only while it has
one thread: a rank forked from the forkserver has one until it starts its own.
"""

import ctypes
import functools
import os
import sys
from pathlib import Path

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000  # <linux/sched.h>
_PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32  # <linux/mount.h>
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE, _MS_RELATIME = 4096, 8192, 16384, 1 << 18, 1 << 21
# statvfs's flags that are also mount's (same bits): noexec, noatime, nodiratime
_KEPT = os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME
PRIVATE = (Path("/tmp"), Path("/dev/shm"))
# What a rank's own libraries read under /proc besides its own process's folder.
_PROC_SHOWN = ("cpuinfo", "meminfo", "stat", "filesystems", "sys")


class RankSandboxError(OSError):
    """The rank could not make its own namespace (no user namespaces on this machine)."""


def enter(bound_back, hide=()):
    """Make this process's private view of the files (see the module's docstring).
    `bound_back`: folders and files Python runs from; `hide`: files no one may read."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid, pid = os.getuid(), os.getgid(), os.getpid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        raise RankSandboxError(ctypes.get_errno(), "a rank could not make its own namespace: "
                               + os.strerror(ctypes.get_errno()))
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")  # the same user inside
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing leaks out to the launch
    cwd = Path.cwd()
    held = [(path, _held(path)) for path in _under_private(bound_back, cwd)]
    proc = [(name, _held(f"/proc/{name}")) for name in (str(pid), *_PROC_SHOWN)
            if os.path.exists(f"/proc/{name}")]
    unreadable = _held("/dev/null")
    for folder in PRIVATE:
        _mount(libc, "tmpfs", str(folder), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    if not any(root == cwd or root in cwd.parents for root in PRIVATE):
        _mount(libc, "tmpfs", str(cwd), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for path, fd in held:
        _bind_read_only(libc, fd, path)
    for path in hide:
        if os.path.isfile(path):
            _bind_read_only(libc, unreadable, Path(path))
    _own_proc(libc, proc, pid)
    os.chdir("/tmp")
    # Linux made the process undumpable when it changed user namespace: its launcher could no
    # longer tell its sockets apart (`wire.py`). No other rank can see it in its /proc.
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def _under_private(paths, cwd):
    """The existing `paths` that a private folder (or the hidden cwd) would hide, parents first
    (a later bind goes over an earlier one)."""
    roots = [*PRIVATE, cwd]
    found = {Path(p) for p in paths
             if os.path.exists(p) and any(r == Path(p) or r in Path(p).parents for r in roots)
             and Path(p) not in roots}
    return sorted(found, key=lambda p: len(p.parts))


def _own_proc(libc, proc, pid):
    """/proc as a small tmpfs with this process's folder bound in, `self` pointing at it, and
    the few system files a rank reads."""
    staged = Path("/tmp/.proc")  # made here while the real /proc still names our descriptors
    staged.mkdir()
    _mount(libc, "tmpfs", str(staged), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755")
    os.symlink(str(pid), staged / "self")
    for name, fd in proc:
        _bind_read_only(libc, fd, staged / name, read_only=name != str(pid))
    _mount(libc, str(staged), "/proc", None, _MS_MOVE)
    staged.rmdir()


def _held(path):
    """(an O_PATH descriptor of `path`, whether it is a folder): what to bind once it is hidden."""
    return os.open(path, os.O_PATH), os.path.isdir(path)


def _bind_read_only(libc, held, path, read_only=True):
    """Bind what `held` (`_held`) names at `path`, made first if missing."""
    fd, is_dir = held
    if not path.exists():
        if is_dir:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    _mount(libc, f"/proc/self/fd/{fd}", str(path), None, _MS_BIND | _MS_REC)
    if read_only:  # the flags a mount of an outer namespace locked (nosuid, noexec, ...) kept
        kept = os.statvfs(path).f_flag & _KEPT
        relatime = _MS_RELATIME if os.statvfs(path).f_flag & os.ST_RELATIME else 0
        _mount(libc, None, str(path), None,
               _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept | relatime)


def _mount(libc, source, target, kind, flags, data=None):
    encode = (lambda s: s.encode() if s is not None else None)
    if libc.mount(encode(source), encode(target), encode(kind), flags, encode(data)) != 0:
        error = ctypes.get_errno()
        raise RankSandboxError(error, f"a rank could not mount {target}: {os.strerror(error)}")


def needed_paths():
    """What Python and the course run from (`sandbox.needed_by_python`, the package)."""
    from dlcourse.grading.sandbox import needed_by_python, package
    return [str(p) for p in needed_by_python()] + [package()]


@functools.cache
def works():
    """True where a process can make the namespaces `enter` makes (a forked child tries)."""
    if not sys.platform.startswith("linux"):
        return False
    unshare = ctypes.CDLL(None, use_errno=True).unshare  # found before the fork, not in it
    pid = os.fork()
    if pid == 0:
        os._exit(0 if unshare(_CLONE_NEWUSER | _CLONE_NEWNS) == 0 else 1)
    return os.waitpid(pid, 0)[1] == 0
