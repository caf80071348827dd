"""What runs inside each rank process that `dlcourse.launch` starts (lesson 00).

The parent hands every rank a `RankJob`: who it is, how to reach the rendezvous store, and the
student's function pickled by value. The rank wires its output to the parent, joins the process
group, runs the function, and sends back one message: its return value or how it failed.
"""

import ctypes
import faulthandler
import linecache
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import forkserver, reduction

import torch
import torch.distributed as dist

from dlcourse import pickling, returned
from dlcourse.errors import RAISED, RETURNED, RankOutcome

# The process group's own timeout (a collective that waits longer raises) is the job's timeout
# plus this: the parent's deadline comes first, so a hang is reported by the parent, by name.
PROCESS_GROUP_MARGIN_S = 30.0
JOINED = b"joined"  # a rank's first message: it is in the process group and its job starts now


@dataclass
class RankJob:
    rank: int
    world_size: int
    backend: str  # "gloo" or "nccl", already chosen by the parent
    threads: int  # torch threads for this rank: cores // world_size, at least 1
    store_port: int  # the parent's TCPStore on 127.0.0.1
    timeout_s: float  # the job's timeout; the process group's is PROCESS_GROUP_MARGIN_S longer
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    sources: dict  # linecache entries of notebook cells, for readable tracebacks
    as_data: bool = False  # send the result with torch.save, for a parent that reads only data
    sandbox: tuple = None  # (bound back, hidden): grading/rank_sandbox.py
    absence: object = None  # what the rank must not have, made true first: grading/absent.py


class InheritedFd:
    """A file descriptor that travels to the rank when its process starts: multiprocessing's
    `DupFd` passes the descriptor itself (SCM_RIGHTS through the forkserver); after start the
    rank owns its copy and the parent closes its own."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup):
    return dup.detach()


def main(job, output, results, lifeline):
    """Entry point of one rank. `output` and `lifeline` arrive as plain integers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when ranks stop
    for needed, make in ((job.absence, _make_absent), (job.sandbox, _enter_sandbox)):
        if needed is not None and not _made(make, job, results):
            return
    _tie_to_launch()
    _send_output_to(output)
    lifeline = Lifeline(lifeline)
    _set_rank_environment(job)
    torch.set_num_threads(job.threads)
    linecache.cache.update(job.sources)
    try:
        _join_process_group(job)
        results.send_bytes(JOINED)  # the job's timeout counts from here (supervise.run_ranks)
        fn, args, kwargs = pickling.loads(job.payload)
        _share_with_children(fn, args, kwargs)
        value = fn(*args, **kwargs)
    except BaseException as error:  # SystemExit and KeyboardInterrupt are failures too
        message = (_describe(error, job.rank), None)
    else:
        message = _result(value, job.rank, job.as_data)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    results.send_bytes(pickle.dumps(message))
    lifeline.job_done.set()
    # Stay in the group until every rank has reported: a rank that left early would turn a peer
    # stuck in a collective it skipped into a "connection closed" error instead of a visible hang.
    lifeline.released.wait()
    if dist.is_initialized():
        dist.destroy_process_group()


def _made(make, job, results):
    """make(job) before anything of the job is unpickled; False, the failure reported to the
    parent, where it cannot be made."""
    try:
        make(job)
        return True
    except Exception as error:
        results.send_bytes(pickle.dumps((_describe(error, job.rank), None)))
        return False


def _make_absent(job):
    """The job's `absence` made true: the answers cannot be imported or read in this rank."""
    from dlcourse.grading import absent
    absent.install(job.absence)


def _enter_sandbox(job):
    """The rank's own sandbox (first, while this process has one thread)."""
    from dlcourse.grading import rank_sandbox
    bound_back, hide = job.sandbox
    pickling.loads(job.payload)  # the modules the job's own objects come from, imported first
    rank_sandbox.enter(bound_back, hide)


def _tie_to_launch():
    """End this rank with its launch, whatever it is doing, and its own children with it.

    - A process group of its own (pgid = this pid): the parent ends the rank and every process
      the rank started (`os.fork`, `subprocess`, a `multiprocessing.Pool`) with one `killpg`.
    - The kernel SIGKILLs it when its parent, the forkserver, exits (Linux PR_SET_PDEATHSIG),
      even while it runs native code holding the GIL, where the Lifeline thread cannot run.
    - The forkserver exits when no process holds its "alive" pipe; multiprocessing gives every
      forked process a copy, so a rank would keep it alive after the launching process died
      (a kernel restart). The launching process keeps the only copy.
    """
    os.setpgid(0, 0)
    parent = os.getppid()
    if _set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)  # the forkserver ended before the signal was armed
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None


def _set_parent_death_signal(sig):
    """prctl(PR_SET_PDEATHSIG, sig) through libc; False where there is no such call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(1, int(sig), 0, 0, 0) == 0  # 1: PR_SET_PDEATHSIG, <linux/prctl.h>


def _share_with_children(fn, args, kwargs):
    """Make the notebook's functions and classes that the job uses findable as `__main__.name`.

    They arrive by value (cloudpickle), but a `multiprocessing.Pool` in the rank sends a function
    to its workers by name, as plain pickle does: `__main__.square` must be the very object. The
    workers are forked from this rank, so they see them too: multiprocessing made "forkserver"
    (how this rank was started) its default here; the platform's default ("fork" on Linux up to
    Python 3.13) is put back, as a process that torchrun starts has it.
    """
    multiprocessing.set_start_method(None, force=True)
    main_module = sys.modules["__main__"]
    seen, todo = set(), [fn, *args, *kwargs.values()]
    while todo:
        obj = todo.pop()
        try:
            if id(obj) in seen or getattr(obj, "__module__", None) != "__main__":
                continue
        except Exception:  # an object whose attribute lookup raises: not a notebook function
            continue
        seen.add(id(obj))
        if isinstance(obj, (types.FunctionType, type)) and "." not in obj.__qualname__:
            setattr(main_module, obj.__qualname__, obj)  # a top-level name of the notebook
        todo += getattr(obj, "__globals__", {}).values()


def _send_output_to(fd):
    """Point stdout and stderr (the file descriptors, so C++ output too) at the parent's pipe."""
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    # A segfault prints this thread's Python stack before the process dies.
    faulthandler.enable(file=sys.stderr, all_threads=False)


class Lifeline:
    """A pipe whose write end only the parent holds: reading it returns b"" (end of file) when
    the parent closes it, after every rank has reported, or when the parent dies, even by SIGKILL.

    A rank still running its job then exits at once; a finished rank is released to leave the
    group. A daemon thread blocked on the read costs nothing until then.
    """

    def __init__(self, fd):
        self.job_done = threading.Event()
        self.released = threading.Event()
        threading.Thread(target=self._wait, args=(fd,), name="dlcourse-lifeline", daemon=True).start()

    def _wait(self, fd):
        while os.read(fd, 1):
            pass
        if not self.job_done.is_set():
            os._exit(1)  # the parent is gone: nobody is waiting for this rank's work
        self.released.set()


def _set_rank_environment(job):
    # The variables torchrun sets, so code written for torchrun also runs here, and a nested
    # dlcourse.launch runs in-process, as it would under torchrun.
    os.environ.update(
        RANK=str(job.rank),
        LOCAL_RANK=str(job.rank),
        WORLD_SIZE=str(job.world_size),
        LOCAL_WORLD_SIZE=str(job.world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(job.store_port),
        OMP_NUM_THREADS=str(job.threads),
    )


def _join_process_group(job):
    timeout = timedelta(seconds=job.timeout_s + PROCESS_GROUP_MARGIN_S)
    store = dist.TCPStore("127.0.0.1", job.store_port, is_master=False, timeout=timeout)
    device = None
    if job.backend == "nccl":
        device = torch.device("cuda", job.rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        job.backend,
        store=store,
        rank=job.rank,
        world_size=job.world_size,
        timeout=timeout,
        device_id=device,
    )


def _result(value, rank, as_data=False):
    """(outcome, the value pickled) to send to the parent; `as_data`: turned into data
    (`returned.as_data`), saved by torch.save and read back here as the parent will read it
    (`torch.load(weights_only=True)`), so a value that is not data fails in the rank, with its
    type named."""
    try:
        if as_data:
            value = returned.as_data(value)  # a numpy number, a Fraction: as Python's
            saved = returned.saved(value)
            returned.loads_as_data(saved)
            return RankOutcome(rank, RETURNED, time=time.monotonic()), saved
        return RankOutcome(rank, RETURNED, time=time.monotonic()), pickling.dumps(value)
    except Exception as error:
        if as_data:  # torch's message is about checkpoints; say what the rank sent instead
            message = f"rank {rank} returned {returned.kind(value)}, {returned.ONLY_DATA}"
        else:
            message = (f"rank {rank} returned a {type(value).__name__}, which cannot be pickled "
                       f"to send back ({error}). Return tensors, numbers, or lists and dicts of them.")
        outcome = RankOutcome(rank, RAISED, "TypeError", _type_names(TypeError), message,
                              f"TypeError: {message}\n", time=time.monotonic())
        return outcome, None


_PEER_ERROR_MARKERS = ("Connection closed by peer", "Connection reset by peer",  # a peer died
                       "gloo/transport")


def _describe(error, rank):
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code is main.__code__:
        tb = tb.tb_next  # the student's frames start below this module's own
    text = "".join(traceback.format_exception(type(error), error, tb))
    name, message = _name_and_message(error)
    from_peer = isinstance(error, dist.DistError) or any(m in text for m in _PEER_ERROR_MARKERS)
    return RankOutcome(rank, RAISED, name, _type_names(type(error)), message, text,
                       time=time.monotonic(), from_peer=from_peer)


def _name_and_message(error):
    """('ValueError', 'bad shape'): the type as a traceback names it ('pkg.mod.Error' outside
    builtins and __main__) and what the traceback's last line says after the name."""
    name, module = type(error).__qualname__, type(error).__module__
    if module not in ("__main__", "builtins"):
        name = f"{module}.{name}"
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    if last.startswith(name + ": "):
        return name, last[len(name) + 2:]
    return name, "" if last == name else str(error).strip()


def _type_names(exception_type):  # every name an `except` of the parent's could match
    return tuple(f"{t.__module__}.{t.__qualname__}" for t in exception_type.__mro__)
