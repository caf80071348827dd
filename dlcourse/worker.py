"""What runs inside each rank process that `dlcourse.launch` starts (lesson 00).

The parent hands every rank a `RankJob`: who it is, how to reach the rendezvous store, and the
student's function pickled by value. The rank wires its output to the parent, joins the process
group, runs the function, and sends back one message: its return value or how it failed.
"""

import faulthandler
import linecache
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import reduction

import torch
import torch.distributed as dist

from dlcourse import pickling


@dataclass
class RankJob:
    rank: int
    world_size: int
    backend: str  # "gloo" or "nccl", already chosen by the parent
    threads: int  # torch threads for this rank: cores // world_size, at least 1
    store_port: int  # the parent's TCPStore on 127.0.0.1
    timeout_s: float  # process-group timeout; the parent's own deadline is shorter
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    sources: dict  # linecache entries of notebook cells, for readable tracebacks


@dataclass
class Failure:
    """How a rank failed, as the parent needs it to pick and explain the culprit."""

    rank: int
    summary: str  # the last line of the traceback, e.g. "ValueError: bad shape"
    traceback: str
    time: float  # time.monotonic() when it was caught: one clock for every process on the host
    from_peer: bool  # a communication error, most likely caused by another rank failing first


class InheritedFd:
    """A file descriptor that travels to the rank when its process starts.

    multiprocessing's `DupFd` passes the descriptor itself (SCM_RIGHTS through the forkserver);
    after start the rank owns its copy and the parent closes its own.
    """

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup):
    return dup.detach()


def main(job, output, results, lifeline):
    """Entry point of one rank. `output` and `lifeline` arrive as plain integers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when ranks stop
    _send_output_to(output)
    lifeline = Lifeline(lifeline)
    _set_rank_environment(job)
    torch.set_num_threads(job.threads)
    linecache.cache.update(job.sources)
    try:
        _join_process_group(job)
        fn, args, kwargs = pickling.loads(job.payload)
        value = fn(*args, **kwargs)
    except BaseException as error:  # SystemExit and KeyboardInterrupt are failures too
        message = ("error", _describe(error, job.rank))
    else:
        message = _result(value, job.rank)
    sys.stdout.flush()
    sys.stderr.flush()
    results.send_bytes(pickle.dumps(message))
    lifeline.job_done.set()
    # Stay in the group until every rank has reported: a rank that left early would turn a peer
    # stuck in a collective it skipped into a "connection closed" error instead of a visible hang.
    lifeline.released.wait()
    if dist.is_initialized():
        dist.destroy_process_group()


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
    timeout = timedelta(seconds=job.timeout_s)
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


def _result(value, rank):
    try:
        return ("ok", pickling.dumps(value))
    except Exception as error:
        summary = (
            f"TypeError: rank {rank} returned a {type(value).__name__}, which cannot be pickled "
            f"to send back ({error}). Return tensors, numbers, or lists and dicts of them."
        )
        return ("error", Failure(rank, summary, summary + "\n", time.monotonic(), False))


# Messages of errors that a rank sees when a peer dies or stops answering.
_PEER_ERROR_MARKERS = ("Connection closed by peer", "Connection reset by peer", "gloo/transport")


def _describe(error, rank):
    tb = error.__traceback__
    if tb is not None and tb.tb_frame.f_code is main.__code__:
        tb = tb.tb_next  # the student's frames start below this module's own
    lines = traceback.format_exception(type(error), error, tb)
    text = "".join(lines)
    summary = traceback.format_exception_only(type(error), error)[-1].strip()
    from_peer = isinstance(error, dist.DistError) or any(m in text for m in _PEER_ERROR_MARKERS)
    return Failure(rank, summary, text, time.monotonic(), from_peer)
