"""The parent's side of a launch: start the ranks, stream what they print, collect one message
from each, and stop them all on the first failure, the deadline or an interrupt (lesson 00).

One thread waits on every rank's output pipe, result pipe and exit at once (`selectors`), so
the notebook cell shows output as it comes and a failure is seen the moment it happens.
"""

import os
import pickle
import selectors
import signal
import sys
import time
from collections import deque


from dlcourse import pickling, worker
from dlcourse.errors import RankError, RankTimeout

GRACE_S = 0.5  # after the first failure, peers get this long to report what they saw
EXIT_WAIT_S = 5.0  # ranks that have sent their result get this long to exit on their own
DRAIN_S = 1.0  # after killing ranks, how long to wait for the rest of their output


class Rank:
    """One rank as the parent sees it."""

    def __init__(self, rank, process, output, results):
        self.rank = rank
        self.process = process
        self.output = output  # read end of the rank's stdout+stderr pipe
        self.results = results  # read end of the rank's result pipe
        self.partial = b""  # an output line not yet ended by a newline
        self.tail = deque(maxlen=15)  # last lines printed, shown if the rank crashes
        self.outcome = None  # ("ok", bytes) | ("error", worker.Failure) | ("died", exit code)
        self.seen_at = None  # parent's time.monotonic() when the outcome arrived
        self.killed = False  # stopped by us: its exit is not its own failure


def run_ranks(ctx, jobs, timeout):
    """Run every `worker.RankJob` in its own process; return the values in rank order.

    `timeout` counts from when every rank has started: the first launch in a process also waits
    for the forkserver to import torch, which is not the job's time.
    """
    lifeline_r, lifeline_w = os.pipe()  # ranks exit when this write end closes
    ranks = []
    try:
        for job in jobs:
            ranks.append(_start(ctx, job, lifeline_r))
        deadline = time.monotonic() + timeout
        os.close(lifeline_r)
        lifeline_r = None
        with selectors.DefaultSelector() as sel:
            _register(sel, ranks)
            _pump(sel, until=lambda: _stop_time(ranks, deadline), done=lambda: _all_reported(ranks))
            if all(r.outcome and r.outcome[0] == "ok" for r in ranks):
                os.close(lifeline_w)  # releases the ranks: they leave the group and exit
                lifeline_w = None
                _drain(sel, EXIT_WAIT_S)
                return [pickling.loads(r.outcome[1]) for r in ranks]
            _kill(ranks)
            _drain(sel, DRAIN_S)
        raise _error(ranks, timeout)
    finally:
        _kill(ranks)
        for fd in (lifeline_r, lifeline_w):
            if fd is not None:
                os.close(fd)
        for r in ranks:
            _close(r)


def _start(ctx, job, lifeline_r):
    out_r, out_w = os.pipe()
    results_r, results_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=worker.main,
        name=f"dlcourse-rank-{job.rank}",
        args=(job, worker.InheritedFd(out_w), results_w, worker.InheritedFd(lifeline_r)),
    )
    try:
        process.start()
    finally:
        os.close(out_w)  # the rank has its own copy; ours would keep the pipe from ending
        results_w.close()
    os.set_blocking(out_r, False)
    return Rank(job.rank, process, out_r, results_r)


def _register(sel, ranks):
    for r in ranks:
        sel.register(r.output, selectors.EVENT_READ, (r, _on_output))
        sel.register(r.results, selectors.EVENT_READ, (r, _on_result))
        sel.register(r.process.sentinel, selectors.EVENT_READ, (r, _on_exit))


def _drain(sel, seconds):
    """Print what the ranks still have to say until every pipe ends, for at most `seconds`."""
    end = time.monotonic() + seconds
    _pump(sel, until=lambda: end, done=lambda: False)


def _pump(sel, until, done):
    """Handle events until `done()`, until the time `until()` passes, or until nothing is left."""
    while sel.get_map() and not done():
        left = until() - time.monotonic()
        if left <= 0:
            return
        for key, _ in sel.select(left):
            rank, handler = key.data
            if not handler(rank):
                sel.unregister(key.fileobj)


def _on_output(r):
    """Print the rank's complete lines, each prefixed with its rank. False at end of file."""
    try:
        data = os.read(r.output, 65536)
    except BlockingIOError:
        return True
    lines = (r.partial + data).split(b"\n")
    r.partial = lines.pop() if data else b""
    if not data and lines[-1] == b"":
        lines.pop()
    for line in lines:
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        r.tail.append(text)
        print(f"[rank {r.rank}] {text}", file=sys.stdout, flush=True)
    return bool(data)


def _on_result(r):
    try:
        message = r.results.recv_bytes()
    except (EOFError, OSError):
        return False
    if r.outcome is None:
        r.outcome, r.seen_at = pickle.loads(message), time.monotonic()
    return True


def _on_exit(r):
    if r.outcome is None and r.results.poll(0):
        _on_result(r)  # it sent its message and exited before we read it
    if r.outcome is None and not r.killed:
        r.outcome, r.seen_at = ("died", r.process.exitcode), time.monotonic()
    return False


def _all_reported(ranks):
    return all(r.outcome is not None for r in ranks)


def _failed(ranks):
    return [r for r in ranks if r.outcome is not None and r.outcome[0] != "ok"]


def _stop_time(ranks, deadline):
    failed = _failed(ranks)
    if failed:
        return min(deadline, min(r.seen_at for r in failed) + GRACE_S)
    return deadline


def _kill(ranks):
    for r in ranks:
        if r.process.is_alive():
            r.killed = True
            r.process.kill()
    for r in ranks:
        r.process.join(timeout=5)


def _close(r):
    for close in (lambda: os.close(r.output), r.results.close):
        try:
            close()
        except OSError:
            pass


def _error(ranks, timeout):
    failed = _failed(ranks)
    if not failed:
        running = [r.rank for r in ranks if r.outcome is None]
        done = [r.rank for r in ranks if r.outcome is not None]
        return RankTimeout(_timeout_message(timeout, running, done), running=running)
    culprit = min(failed, key=_blame_order)
    others = {r.rank: _summary(r) for r in failed}
    message = f"rank {culprit.rank} {_summary(culprit)}"
    stopped = [r.rank for r in ranks if r is not culprit]
    if stopped:
        message += f" (so {_ranks(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped)"
    detail = _detail(culprit)
    return RankError(f"{message}\n\n{detail}", culprit.rank, detail, others)


def _blame_order(r):
    """The rank that caused the failure sorts first: its own error, then a crash, then a rank that
    only saw a peer disappear; within each kind, the earliest."""
    kind, detail = r.outcome
    if kind == "error":
        return (2 if detail.from_peer else 0, detail.time)
    return (1, r.seen_at)


def _summary(r):
    kind, detail = r.outcome
    if kind == "error":
        return f"raised {detail.summary}"
    if detail is not None and detail < 0:
        name = signal.Signals(-detail).name
        return f"was killed by {name}" + (" (a crash in native code)" if name == "SIGSEGV" else "")
    return f"exited with code {detail} before returning a result"


def _detail(r):
    kind, detail = r.outcome
    if kind == "error":
        return f"Traceback of rank {r.rank}:\n{detail.traceback}"
    tail = "\n".join(r.tail) or "(it printed nothing)"
    return f"Last output of rank {r.rank}:\n{tail}"


def _timeout_message(timeout, running, done):
    message = f"the job did not finish in {timeout:g} s: {_ranks(running)} still running"
    if done:
        message += f"; {_ranks(done)} finished"
    return message + (
        ". A rank waiting for a collective or a recv that its peers never make (a skipped "
        "collective, a mismatched send/recv) looks like this. If the work is only slow, pass a "
        "larger timeout=."
    )


def _ranks(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
