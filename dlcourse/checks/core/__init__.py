"""The core that every exercise set's checks build on: run a student's function on real ranks,
compare what each rank returned with an independent reference, refuse the lesson's answers while
it runs, and fail with a message a student can act on. Lesson 00's checks
(`dlcourse/checks/launch/`) are the worked example.

    ranks.py    run_on_ranks, Submitted (the student's code on real ranks)
    received.py what a rank received, counted outside it, held between two bounds
    in_process.py  call_in_process, call_each_in_process (formulas; one rank when graded)
    cases.py    @fresh_cases (cases drawn afresh on every run, the one way)
    expect.py   expect_tensor, fail, CheckFailed, ... (comparing, and the messages)
    refuse.py   an answer refused however it is reached: replaced, refusal, and its copies
                (copies_in, made before; copies_refused, made while the student's code runs),
                both found by one walker, functions_reached
    communication.py  what a rank may not talk through: forbidden collectives, the c10d
                store (no_store); none_named
    audit.py    an audit hook that keeps those refusals on (no ctypes, no setprofile)
    answers.py  the one engine an exercise set declares its answers to: Answers
    stubs.py    a function not written yet
    verdict.py  `python -m dlcourse.checks.core.verdict`: a submission's check, graded apart

A check in `dlcourse/checks/<name>/` looks like this:

    def check_gather_all(gather_all, timeout=CHECK_TIMEOUT_S):
        for world_size, shape, dtype in CASES:                 # inputs the student never saw
            xs = [random_tensor(shape, dtype, seed=r) for r in range(world_size)]
            where = f"gather_all on {world_size} ranks, x: {describe(xs[0])}"
            outcomes = run_on_ranks(gather_all, [(x,) for x in xs], exercise="gather_all",
                                    where=where, timeout=timeout)
            for rank, (got, args_after) in enumerate(outcomes):
                expect_tensor(got, torch.stack(xs), where=where, rank=rank, hint="...")

The API:
- `run_on_ranks(fn, rank_args, exercise=, where=, hint=, forbid=(), why_forbidden="",
  hang_hint="", harness=None, guard=None, timeout=, receives=None, received=None)`
  runs `fn(*rank_args[r])` (or `harness(fn, *rank_args[r])`) on rank r of `len(rank_args)`
  gloo ranks (rank r is sent `rank_args[r]` only: give it its shard, never the whole, and its
  code cannot read the whole) and returns, in rank order, `(value, args_after)`: what the rank
  returned and its arguments after the call (to catch a function that changes its caller's
  tensors). A rank that raises, a function not written yet (`NotImplementedError`), and a job
  still running after `timeout` seconds (a deadlock) all become `CheckFailed`, named by `where`
  (the case) and followed by `hint` (a deadlock by `hang_hint`: what makes this exercise's
  messages wait forever); no process is left behind (`dlcourse.launch` stops every rank).
- `receives=[bytes per rank]`: the fewest bytes each rank must receive from the others,
  counted by the kernel on the ranks' connections from outside them (`grading/wire.py`): data
  moved by a file, or a token message with a faked counter, fails. `received={}` is filled with
  that count, for `ranks.expect_received_at_most` after the check's own messages: data a rank did
  not need fails. gloo's headers count too (~144 B a message a peer): allow `HEADER_ROOM` a peer
  above the data, and give one case `WIRE_FLOOR` (2 KiB) or more from each rank to each other.
  `received.expect_received_data(received, data, where, hint, least=)` is both bounds for a
  check whose messages are its data (`data[r]`: the bytes rank r must receive),
  `received.wire_floor_units(nbytes)` how many pieces of nbytes make a wide case, and
  `received.torch_received(job, rank_args)` what torch's own collectives receive (gloo's
  algorithms: its reduce-scatter receives about what an all-reduce does), the data to bound by.
  Its wide case must be KiBs a tensor: on tensors of a few hundred bytes gloo's all-reduce
  receives more than an all-gather of them (its messages' headers), so no bound tells them apart.
- `forbid=("all_reduce", ...)` or `forbid=COLLECTIVES`: inside the ranks those `torch.distributed`
  functions raise `ForbiddenCall` while the student's function runs, and the check fails with
  "rank R called dist.all_reduce, which this exercise does not allow: <why_forbidden>". Use it
  for "build it from send/recv" exercises. Every check refuses the c10d store too (`no_store`):
  data does not go from rank to rank through the rendezvous's key-value store.
  The guard is installed before the student's function
  is unpickled, so `from torch.distributed import all_reduce` in the notebook is caught too.
  The same collectives are refused at torch's dispatcher too, so a `ProcessGroup` method or a
  functional collective is caught ("called all_reduce (through the process group), ..."); a
  torch function that calls a forbidden one inside (all_gather_object calls all_gather) is
  refused with it (`communication.py`).
- `expect_tensor(got, expected, where=, rank=, atol=0, rtol=0, tolerance="", hint="")`: type,
  shape, dtype, then values; names the first differing element and how many differ. Exact unless
  a tolerance is given; `tolerance` says where it comes from and is printed with a mismatch.
- `expect_none(got, ...)`, `expect_unchanged(before, after, ...)`, `fail(where, rank, problem,
  hint)` for anything else (`expect.py`). All raise `CheckFailed`, an `AssertionError`, so a
  grader cell fails and nbval records it; its first line is what the gradebook shows.
- `random_tensor(shape, dtype, seed)` and `describe(tensor)` for inputs and messages.
- `@fresh_cases`: the check draws its cases from `rng`, seeded afresh on every run (a student
  cannot tabulate the answers), keeping fixed edge cases first; a failure names the seed, and
  `check_x(fn, seed=S)` repeats the run.
- For exercises that are formulas, not ranks: `call_in_process(fn, args, exercise=, where=,
  guard=)` runs the student's function here and turns what it raises into `CheckFailed`
  (`call_each_in_process(fn, [(args, where)], ...)` for many cases: graded, one launch);
  `replaced(namespaces, [(original, stand_in)])` with `refusal(what, why)` as the stand-in makes
  a library function that holds the answer raise while the student's function runs, however it
  is reached: by any name, a default argument, or a copy of it (`refuse.py`).
- `Answers(packages=, torch=, single=, checks=, allow=, also=)`: what an exercise set refuses,
  declared once (the lesson's code, torch's, the set's own check modules); a check passes
  `guard=ANSWERS.in_rank` to `run_on_ranks`, `guard=ANSWERS.in_process` to `call_in_process`
  (`answers.py`). `Answers(rank_side=("dlcourse.checks.<set>.in_rank",))` names the set's
  rank-side code (harnesses, `call_in_process(answer=)`): it imports no answer, and under
  `dlcourse grade` it is all a rank loads of the set, the answer modules absent from the rank
  (`grading/absent.py`); references are computed here, in the checking process.
- `expect_callable(fn, exercise)`: the grader cell got the function itself, not its result.
"""

from dlcourse.checks.core.answers import Answers, library_answers, refusing_answers  # noqa: F401
from dlcourse.checks.core.cases import fresh_cases  # noqa: F401
from dlcourse.checks.core.expect import (CheckFailed, as_tensor, describe, dtype_name,  # noqa: F401
                                         expect_callable, expect_none, expect_tensor,
                                         expect_unchanged, fail, kind, random_tensor)
from dlcourse.checks.core.in_process import call_each_in_process, call_in_process  # noqa: F401
from dlcourse.checks.core.ranks import (CHECK_TIMEOUT_S, COLLECTIVES, StudentCode,  # noqa: F401
                                        Submitted, run_on_ranks)
from dlcourse.checks.core.communication import forbidden, no_store, none_named  # noqa: F401
from dlcourse.checks.core.refuse import ForbiddenCall, Refused, refusal, replaced  # noqa: F401
