"""Running a student's function where the check's frames and data are not: on real gloo ranks
(`run_on_ranks`, each rank sent its own arguments only); a submission's code (`Submitted`) only
ever in a rank. Formula exercises, called in the checking process, are `in_process.py`'s. The
guide to the whole core is `dlcourse/checks/core/__init__.py`.
"""

import contextlib
import functools

import torch

from dlcourse import pickling, returned
from dlcourse.checks.core.audit import student_runs
from dlcourse.checks.core.expect import CheckFailed, expect_callable
from dlcourse.checks.core.communication import forbidden, no_store, none_named
from dlcourse.checks.core.refuse import ForbiddenCall, Refused, copies_refused
from dlcourse.checks.core.stubs import (NotWritten, is_stub_text, not_written, stub_message,
                                       stub_raising)
from dlcourse.errors import RankError, RankTimeout
from dlcourse.launcher import PerRank, launch_as_data, launch_watched

# A check's launch takes ~0.1 s warm, ~2 s for the first one in a kernel (the forkserver imports
# torch). 10 s leaves room for a loaded machine and still reports a deadlock within seconds.
CHECK_TIMEOUT_S = 10.0

# What a rank must receive from each other rank, in at least one case of a check that bounds
# received bytes (`receives=`, `receives_at_most=`), for the bounds to tell data from headers:
# the kernel counts gloo's headers too, ~144 B a message a peer (measured on torch 2.13's gloo:
# an all-to-all, all_to_all_single or send/recv of nothing, 136 to 148 B on 2 to 4 ranks, 20 of
# them 2872 B), so a floor of a few bytes is met by a token message.
WIRE_FLOOR = 2048
# What a rank may receive from each other rank beyond the exercise's data: the headers of up to
# seven messages a peer (a correct answer may send a piece at a time). More than that, in a
# case of WIRE_FLOOR bytes a peer, is data it did not need (every rank's whole x where an
# all-to-all brings a piece brings it WIRE_FLOOR more a peer at least).
HEADER_ROOM = 1024

# The collectives of torch.distributed; `forbid=COLLECTIVES` leaves send/recv (and barrier).
COLLECTIVES = (
    "broadcast", "reduce", "all_reduce", "all_gather", "all_gather_into_tensor", "gather",
    "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "all_gather_object", "gather_object", "scatter_object_list", "broadcast_object_list",
    "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base",
)


def run_on_ranks(fn, rank_args, *, exercise, where=None, hint="", forbid=(), why_forbidden="",
                 hang_hint="", harness=None, guard=None, timeout=CHECK_TIMEOUT_S, receives=None,
                 received=None):
    """Run `fn(*rank_args[rank])` on every rank; return [(value, args_after)] in rank order.

    `where` names the case in messages (default: the exercise); `hint` follows a rank's error,
    `hang_hint` a deadlock's. `guard()`, if given, makes a context manager that is active in the
    rank whenever the student's code runs, e.g. `ANSWERS.in_rank` (an exercise set's `Answers`)
    to refuse the lesson's answers; `forbid` refuses torch.distributed functions the same way.
    `harness(student, *args)`, if given, is called in the rank instead of `fn(*args)`: a
    module-level function of the check's that builds what the student's function works on, calls
    `student(...)` (the student's function, inside the guards) and returns what the check
    compares. For a class (an autograd Function), `with student.guarded(): student.fn.apply(...)`.
    `receives`, if given, is the fewest bytes each rank must receive from the others: counted
    by the kernel on the ranks' connections, outside them (`grading/wire.py`), so what a rank's
    own counter says cannot change it; a rank that received less fails. `received`, if given
    (a dict), is filled with that count, {rank: bytes}, for the check to bound from above with
    `expect_received_at_most` once its own messages, which say more, have had their say.
    """
    __tracebackhide__ = True  # IPython shows the student the check's message, not this frame
    expect_callable(fn, exercise)
    if stub_message(fn) is not None:  # it can only raise: say so without starting ranks
        raise CheckFailed(not_written(exercise, stub_message(fn)))
    world_size = len(rank_args)
    submitted = isinstance(fn, Submitted)
    payload = fn.payload if submitted else pickling.dumps(fn)
    # A submission's function (`dlcourse grade`) may have changed anything in its ranks: what
    # they send back is read as data only, never unpickled as objects here. Its ranks have
    # none of the exercise's answers (`graded_launch`).
    launch_options, rank_guard = graded_launch(guard, "in_rank") if submitted else ({}, guard)
    student = StudentCode(payload, tuple(forbid), why_forbidden, rank_guard)
    measured = {} if received is None else received
    start = functools.partial(launch_as_data, **launch_options) if submitted else launch_watched
    try:
        # gloo, even on GPUs: a check tests the logic on small CPU tensors the same everywhere.
        # each rank gets its own arguments only: none can read another's (or the whole)
        outcomes = start(_in_rank, student, PerRank(rank_args), harness, submitted,
                         world_size=world_size, backend="gloo", timeout=timeout,
                         wire=None if receives is received is None else measured.update)
    except RankTimeout as error:
        raise CheckFailed(
            f"{where or exercise}: did not finish within {timeout:g} s on {world_size} ranks "
            f"(still running: ranks {', '.join(map(str, error.running))}), so it is most likely "
            "waiting forever: a collective that not every rank calls, or a recv with no matching "
            "send. Every rank must make the same collective calls in the same order."
            + (f"\nHint: {hang_hint}" if hang_hint else "")
        ) from None
    except RankError as error:
        raise CheckFailed(explain_failure(exercise, where or exercise, hint, error)) from None
    expect_received_at_least(measured, receives, where or exercise, hint)
    return outcomes


_COUNTED = "from the other ranks (counted on its connections, outside its process)"


def expect_received_at_least(measured, receives, where, hint):
    """Each rank received at least `receives[rank]` bytes (where the kernel's count was read)."""
    for rank, least in enumerate(receives or []):
        if rank in measured and measured[rank] < least:
            raise CheckFailed(f"{where}: rank {rank} received {measured[rank]} bytes {_COUNTED}, "
                              f"where this exercise must bring it at least {least}"
                              + (f"\nHint: {hint}" if hint else ""))


def expect_received_at_most(received, most, where, hint=""):
    """Each rank received at most `most[rank]` bytes, by the kernel's count that `run_on_ranks`
    filled `received` with (where it was read): more is data the rank did not need, whatever its
    own counter says. A check calls it after its own checks of what a rank says it sent."""
    __tracebackhide__ = True
    for rank, bound in enumerate(most):
        if rank in received and received[rank] > bound:
            raise CheckFailed(f"{where}: rank {rank} received {received[rank]} bytes {_COUNTED}, "
                              f"where this exercise brings it at most {bound}, gloo's headers "
                              "included: it was sent data it does not need"
                              + (f"\nHint: {hint}" if hint else ""))


def graded_launch(guard, kind, *args):
    """(launch_as_data's options, the guard a graded rank enters) for `guard(*args)`'s `Answers`:
    the answer modules absent from the rank, all but the set's `rank_side` code
    (`grading/absent.py`), and the same declaration's guard refusing what the rank still has (its
    walk skips a module that does not import there): torch's answers, the `rank_side` modules.
    A guard of another kind: as it is, nothing absent. `kind` is the guard's flavour: "in_rank"
    (`run_on_ranks`) or "in_process" (one rank)."""
    try:
        answers = getattr(guard(*args), "answers", None) if guard else None
    except Exception:  # a guard that needs what it guards: it hides nothing
        answers = None
    if answers is None:
        return {}, guard
    absence = answers.absence()
    return {"hide": absence.files, "absence": absence}, getattr(answers, kind)


class StudentCode:
    """The student's function as a rank receives it: pickled, loaded only inside the exercise's
    guards (so a name the student imported finds the refusal), and called inside them."""

    def __init__(self, payload, forbid=(), why_forbidden="", guard=None):
        self.payload, self.forbid, self.why_forbidden, self.guard = (payload, forbid,
                                                                     why_forbidden, guard)
        self._fn, self._originals = None, ()

    @contextlib.contextmanager
    def guarded(self):
        """The exercise's refusals, active; a copy of a refused function that the student's
        function holds (made before the guard, or rebuilt by pickling) is refused too."""
        with forbidden(self.forbid, self.why_forbidden), none_named(), no_store(), \
                (self.guard() if self.guard else contextlib.nullcontext()) as refused:
            self._originals = originals_of(refused)
            refuse_copies(refused, self.fn)
            with copies_refused(refused, self.fn):
                yield

    @property
    def fn(self):
        """The student's object; load it inside `guarded()` (the audit hook armed: making a
        function of a refused original's code is refused while it unpickles too)."""
        if self._fn is None:
            self._fn = student_runs(pickling.loads, (self.payload,), {}, self._originals)
        return self._fn

    def __call__(self, *args, **kwargs):
        with self.guarded():
            try:
                return student_runs(self.fn, args, kwargs, self._originals)
            except NotImplementedError as error:
                raise named_stub(error, getattr(self.fn, "__name__", None))


def named_stub(error, caller):
    """`error`, or where a stub other than the student's function raised it (the student's
    function calls another exercise's, still unwritten), a NotWritten that names that stub."""
    stub = stub_raising(error)
    if stub is None or stub == caller or isinstance(error, NotWritten):
        return error
    return NotWritten(not_written(stub, str(error), caller)).with_traceback(None)


def explain_failure(exercise, where, hint, error):
    """The CheckFailed message for a launch that failed, from the culprit's `RankOutcome`."""
    outcome = error.outcome
    if outcome is not None and outcome.raised(ForbiddenCall):
        return f"{where}: rank {error.rank} {outcome.message}"
    if outcome is not None and outcome.raised(NotWritten):  # another exercise's stub, named
        return outcome.message
    # The stub that `dlcourse exercises build` writes, not a NotImplementedError from torch.
    if (outcome is not None and outcome.exception == "NotImplementedError"
            and is_stub_text(outcome.message)):
        return not_written(exercise, outcome.message)
    summary = outcome.summary if outcome is not None else str(error).splitlines()[0]
    hint = f"\nHint: {hint}" if hint else ""
    return f"{where}: rank {error.rank} {summary}{hint}\n\n{error.traceback}"


def _in_rank(student, args, harness, as_data=False):
    """Runs in every rank, on this rank's arguments: the student's function (inside its
    guards), or the check's harness. `as_data`: the arguments come back as data (a module or
    optimizer as None)."""
    value = harness(student, *args) if harness else student(*args)
    # numpy numbers and arrays, Fractions as Python's, as `dlcourse grade` reads them (data only)
    return returned.as_data(value), (_data_only(args) if as_data else args)


def _data_only(value):
    """`value` with everything that is not a tensor, number, string or container of them as None."""
    if isinstance(value, (torch.Tensor, str, bytes, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_data_only(v) for v in value)
    if isinstance(value, dict):
        return {k: _data_only(v) for k, v in value.items()}
    return None


class Submitted:
    """A submission's function or class as `dlcourse grade` hands it to a check: the bytes the
    notebook's kernel pickled, never unpickled in the checking process. Only the ranks load it
    (`run_on_ranks`, and `call_in_process`, which runs it on one rank), and what they send back
    is read as data. So the check's verdict comes from a process no student cell ran in."""

    def __init__(self, name, payload):
        self.__name__ = self.__qualname__ = name
        self.payload = payload

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} is a submission's code: run it on ranks "
                           "(run_on_ranks, call_in_process), never in the checking process")

    def __repr__(self):
        return f"<submitted {self.__name__}>"


def originals_of(refused):
    """The refused functions' (code, message) pairs, as a tuple the student's code cannot
    change (`audit.student_runs`)."""
    return tuple(refused.codes) if isinstance(refused, Refused) else ()


def refuse_copies(refused, fn):
    message = refused.copies_in(fn) if isinstance(refused, Refused) else None
    if message:
        raise ForbiddenCall(message)
