"""What happened on each rank, as data, and the errors a launch raises when ranks fail (lesson 00
shows one on purpose). Every sentence a failed launch says is composed here, from `RankOutcome`s.
"""

import re
import signal
from dataclasses import dataclass

from dlcourse import i18n

# What a rank did; `RankOutcome.state` is one of these.
RETURNED = "returned"  # its function returned a value
RAISED = "raised"  # its function raised (the exception's type, message and traceback are kept)
EXITED = "exited"  # the process ended with an exit code before sending a result
SIGNALLED = "signalled"  # the process was killed by a signal it did not send us (a segfault)
RUNNING = "running"  # still running at the deadline, or when a failure stopped the job


@dataclass
class RankOutcome:
    """One rank's report to the parent: plain data, no exception object crosses processes."""

    rank: int
    state: str  # RETURNED | RAISED | EXITED | SIGNALLED | RUNNING
    exception: str = ""  # RAISED: the type as a traceback names it, e.g. "ValueError"
    exception_types: tuple = ()  # RAISED: "module.QualName" of the type and its bases
    message: str = ""  # RAISED: what the exception says, e.g. "bad shape" (may be empty)
    traceback: str = ""  # RAISED: the rank's own traceback (the launcher's frames left out)
    last_output: str = ""  # EXITED / SIGNALLED: the last lines it printed
    exit_code: int = None  # EXITED: the process's exit code
    signal: str = ""  # SIGNALLED: the signal's name, e.g. "SIGSEGV"
    time: float = 0.0  # time.monotonic() when it happened: one clock for every process on a host
    from_peer: bool = False  # RAISED: a communication error, most likely a peer failing first

    def raised(self, exception_type):
        """True if the rank raised `exception_type` or a subclass of it."""
        name = f"{exception_type.__module__}.{exception_type.__qualname__}"
        return self.state == RAISED and name in self.exception_types

    @property
    def failed(self):
        return self.state in (RAISED, EXITED, SIGNALLED)

    @property
    def summary(self):
        """What the rank did, as a clause: 'raised ValueError: bad shape', 'was killed by
        SIGSEGV (a crash in native code)', 'exited with code 7 before returning a result'."""
        if self.state == RAISED:
            message = self.message
            if self.exception == "NotImplementedError":  # an exercise's stub: its hint localised
                message = i18n.stub_message(message)
            return f"raised {self.exception}" + (f": {message}" if message else "")
        if self.state == SIGNALLED:
            native = " (a crash in native code)" if self.signal == "SIGSEGV" else ""
            reason = native_reason(self.last_output)
            return f"was killed by {self.signal}{native}" + (f": {reason}" if reason else "")
        if self.state == EXITED:
            return f"exited with code {self.exit_code} before returning a result"
        return "is still running" if self.state == RUNNING else "returned"

    @property
    def detail(self):
        """Its traceback, or for a rank that died, what it printed last."""
        if self.state == RAISED:
            return f"Traceback of rank {self.rank}:\n{self.traceback}"
        return f"Last output of rank {self.rank}:\n{self.last_output or '(it printed nothing)'}"


# C++ prints an uncaught exception as "terminate called after throwing an instance of 'T'" then
# "  what():  <message>" before it aborts; gloo's messages start with where its check failed.
_WHAT = re.compile(r"^\s*what\(\):\s*(?:\[enforce fail at [^\]]*\]\s*)?(?P<reason>.+)$")


def native_reason(last_output):
    """What native code said as it aborted the rank, e.g. gloo's 'op.preamble.length <=
    op.nbytes. 32 vs 16. Received data size doesn't match expected size. ...' for a message of the
    wrong size; "" if the rank's last output holds no such line."""
    for line in reversed(last_output.splitlines()):
        match = _WHAT.match(line)
        if match:
            return match.group("reason").strip()
    return ""


def died(rank, exit_code, time):
    """The outcome of a rank whose process ended before it sent a result."""
    if exit_code is not None and exit_code < 0:
        return RankOutcome(rank, SIGNALLED, signal=signal.Signals(-exit_code).name, time=time)
    return RankOutcome(rank, EXITED, exit_code=exit_code, time=time)


class RankError(RuntimeError):
    """A rank raised, exited or crashed; every rank was stopped.

    `rank` is the rank that failed first (the cause, not a peer that only saw it go),
    `traceback` its traceback or last output, `outcomes` every rank's `RankOutcome` (by rank),
    `failures` every failed rank's report as a clause ('raised ValueError: ...').
    `hang_report`: where the ranks' calls first disagree, if the job ran under lesson 10's
    `dlcourse.debug.launch_traced` (a `dlcourse.debug.hang.Mismatch`); None otherwise.
    """

    hang_report = None

    def __init__(self, message, rank=None, traceback="", outcomes=None):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.outcomes = outcomes or {}

    @property
    def outcome(self):
        """The culprit's `RankOutcome` (None for a timeout, which has no single culprit)."""
        return self.outcomes.get(self.rank)

    @property
    def failures(self):
        return {r: o.summary for r, o in self.outcomes.items() if o.failed}


class RankTimeout(RankError, TimeoutError):
    """The job was still running at its deadline; `running` lists the ranks that had not finished."""

    def __init__(self, message, running=(), outcomes=None):
        super().__init__(message, outcomes=outcomes)
        self.running = list(running)


def launch_error(outcomes, timeout):
    """The error for a launch that did not return: `outcomes` has one `RankOutcome` per rank."""
    failed = [o for o in outcomes if o.failed]
    by_rank = {o.rank: o for o in outcomes}
    if not failed:
        running = [o.rank for o in outcomes if o.state == RUNNING]
        done = [o.rank for o in outcomes if o.state != RUNNING]
        return RankTimeout(_timeout_message(timeout, running, done), running, by_rank)
    culprit = min(failed, key=_blame_order)
    message = f"rank {culprit.rank} {culprit.summary}"
    stopped = [o.rank for o in outcomes if o is not culprit]
    if stopped:
        message += f" (so {_ranks(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped)"
    return RankError(f"{message}\n\n{culprit.detail}", culprit.rank, culprit.detail, by_rank)


def _blame_order(outcome):
    """The rank that caused the failure sorts first: its own error, then a crash, then a rank that
    only saw a peer disappear; within each kind, the earliest."""
    if outcome.state == RAISED:
        return (2 if outcome.from_peer else 0, outcome.time)
    return (1, outcome.time)


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
