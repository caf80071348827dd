"""The parent's side of a launch: start the ranks, stream what they print, collect one message
from each, and stop them all on the first failure, the deadline or an interrupt (lesson 00).

One thread waits on every rank's output pipe, result pipe and exit at once (`selectors`), so
the notebook cell shows output as it comes and a failure is seen the moment it happens.
"""

import io
import os
import pickle
import selectors
import signal
import sys
import time
from collections import deque

import torch

from dlcourse import errors, pickling, worker
from dlcourse.errors import RUNNING, RankOutcome

GRACE_S = 0.5  # after the first failure, peers get this long to report what they saw
EXIT_WAIT_S = 5.0  # ranks that have sent their result get this long to exit on their own
DRAIN_S = 1.0  # after killing ranks, how long to wait for the rest of their output
JOIN_S = 60.0  # how long ranks may take to start and join the process group, beyond `timeout`


class Rank:
    """One rank as the parent sees it."""

    def __init__(self, rank, process, output, results):
        self.rank = rank
        self.process = process
        self.output = output  # read end of the rank's stdout+stderr pipe
        self.results = results  # read end of the rank's result pipe
        self.partial = b""  # an output line not yet ended by a newline
        self.tail = deque(maxlen=15)  # last lines printed, shown if the rank crashes
        self.outcome = None  # an errors.RankOutcome once it reported or died
        self.value = None  # what it returned, pickled
        self.seen_at = None  # parent's time.monotonic() when the outcome arrived
        self.joined_at = None  # parent's time.monotonic() when the rank said it joined the group
        self.killed = False  # stopped by us: its exit is not its own failure
        self.as_data = False  # its messages are read as data only (`worker.RankJob.as_data`)


def run_ranks(ctx, jobs, timeout, wire=None):
    """Run every `worker.RankJob` in its own process; return the values in rank order.
    `wire`, if given, is called once every rank has returned, while their connections are still
    open, with {rank: bytes it received from the other ranks}, counted by the kernel
    (`dlcourse/grading/wire.py`; {} where it cannot be read).

    `timeout` counts from when every rank has joined the process group: the first launch in a
    process also waits for the forkserver to import torch, and a loaded machine may take seconds
    to start a process; neither is the job's time. Starting and joining get `JOIN_S` more.
    """
    lifeline_r, lifeline_w = os.pipe()  # ranks exit when this write end closes
    ranks = []
    try:
        for job in jobs:
            ranks.append(_start(ctx, job, lifeline_r))
        started = time.monotonic()
        os.close(lifeline_r)
        lifeline_r = None
        with selectors.DefaultSelector() as sel:
            _register(sel, ranks)
            _pump(sel, until=lambda: _stop_time(ranks, _deadline(ranks, started, timeout)),
                  done=lambda: _all_reported(ranks))
            if all(r.outcome and r.outcome.state == errors.RETURNED for r in ranks):
                if wire is not None:
                    wire(_received(ranks))
                os.close(lifeline_w)  # releases the ranks: they leave the group and exit
                lifeline_w = None
                _drain(sel, EXIT_WAIT_S)
                return [_value(r) for r in ranks]
            _kill(ranks)
            _drain(sel, DRAIN_S)
        raise errors.launch_error([_final_outcome(r) for r in ranks], timeout)
    finally:
        _kill(ranks)
        for fd in (lifeline_r, lifeline_w):
            if fd is not None:
                os.close(fd)
        for r in ranks:
            _close(r)


def _received(ranks):
    """{rank: bytes received from the other ranks}, read by the kernel's counters; {} if none."""
    from dlcourse.grading import wire
    counts = wire.received({r.process.pid for r in ranks})
    return {r.rank: counts[r.process.pid] for r in ranks} if counts is not None else {}


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
    rank = Rank(job.rank, process, out_r, results_r)
    rank.as_data = job.as_data
    return rank


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
    if r.joined_at is None and r.outcome is None and message == worker.JOINED:
        r.joined_at = time.monotonic()
    elif r.outcome is None:
        (r.outcome, r.value), r.seen_at = _report(r, message), time.monotonic()
    return True


def _report(r, message):
    """(outcome, value bytes) from a rank's message. A rank that runs code we do not trust
    (`as_data`) could send any bytes: they are read by an unpickler that builds nothing but a
    `RankOutcome` of plain values, and anything else counts as the rank's failure."""
    if not r.as_data:
        return pickle.loads(message)
    try:
        outcome, value = _OutcomeUnpickler(io.BytesIO(message)).load()
        if isinstance(outcome, RankOutcome) and isinstance(value, (bytes, type(None))):
            return outcome, value
    except Exception:
        pass
    return _not_data(r.rank, "sent a report that is not a RankOutcome"), None


def _value(r):
    """What the rank returned: for `as_data`, read by torch.load(weights_only=True), which builds
    tensors, numbers, strings and containers of them and refuses anything else."""
    if not r.as_data:
        return pickling.loads(r.value)
    try:
        return torch.load(io.BytesIO(r.value), weights_only=True)
    except Exception as error:
        raise errors.RankError(f"rank {r.rank} returned something that is not data ({error})",
                               r.rank, outcomes={r.rank: _not_data(r.rank, str(error))}) from None


def _not_data(rank, why):
    return RankOutcome(rank, errors.RAISED, "TypeError", ("builtins.TypeError",),
                       f"rank {rank} {why}: return tensors, numbers, or lists and dicts of them",
                       time=time.monotonic())


class _OutcomeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) == ("dlcourse.errors", "RankOutcome"):
            return RankOutcome
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a rank's report")


def _on_exit(r):
    _kill_group(r)  # what the rank started ends with it
    while r.outcome is None and r.results.poll(0):
        if not _on_result(r):  # it sent its messages and exited before we read them
            break
    if r.outcome is None and not r.killed:
        r.seen_at = time.monotonic()
        r.outcome = errors.died(r.rank, r.process.exitcode, r.seen_at)
    return False


def _final_outcome(r):
    """Once the output is drained: a rank that died gets its last lines (a segfault's stack)."""
    if r.outcome is None:
        return RankOutcome(r.rank, RUNNING)
    if r.outcome.state in (errors.EXITED, errors.SIGNALLED):
        r.outcome.last_output = "\n".join(r.tail)
    return r.outcome


def _all_reported(ranks):
    return all(r.outcome is not None for r in ranks)


def _failed(ranks):
    return [r for r in ranks if r.outcome is not None and r.outcome.failed]


def _deadline(ranks, started, timeout):
    """`timeout` after the last rank joined the group; until all have, `JOIN_S` later than that
    counted from the start (a rank stuck joining still ends in a timeout)."""
    joined = [r.joined_at for r in ranks]
    if None in joined:
        return started + JOIN_S + timeout
    return max(joined) + timeout


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
        _kill_group(r)
    for r in ranks:
        r.process.join(timeout=5)


def _kill_group(r):
    """SIGKILL the processes the rank started: its process group (`worker._tie_to_launch`).
    Linux gives no new process a pid that is still a process group's id, so while any of them
    lives the group's id is theirs."""
    if r.process.pid is None:
        return
    try:
        os.killpg(r.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no such group any more (or not yet: the rank had not made it)


def _close(r):
    for close in (lambda: os.close(r.output), r.results.close):
        try:
            close()
        except OSError:
            pass
