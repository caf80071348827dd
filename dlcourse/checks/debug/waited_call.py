"""Check for lesson 10's sixth exercise (`exercises/10_debugging.ipynb`), a function called here on
real flight-recorder dumps:

    check_waited_call(waited_call)   from every rank's dump of a hung job, the rank the others wait
                                     on and the call (its `collective_seq_id`) they wait in

The job runs on 4 gloo ranks (`hung_dumps`): lesson 10's data-parallel steps, one all-reduce
per parameter on a group of its own with a 2 s timeout, and each step's loss all-reduced on the
default group in between (so a rank's entries interleave two groups, and an entry's place in
the list is not its call number). In each case one rank, drawn (rank 0 in one case, another
rank in another), stops after a drawn number of the group's calls, none at all in some runs
(its data ran out); the others enter the next call and wait until the group's timeout. Every
rank then dumps torch's flight recorder (`torch._C._distributed_c10d._dump_fr_trace()`, as
torch's watchdog does on NCCL at a timeout), the entries of the earlier cases' groups left out.

The answer is read from the dumps after the student's function returned
(`reference.waited_on`) and must agree with the draw. While it runs, the lesson's tool and
torch's own analyser of these dumps (`torch.distributed.flight_recorder`) are refused.
"""

import copy
import datetime
import functools
import importlib
import logging
import numbers
import pickle

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.checks.core import (CheckFailed, call_in_process, expect_callable, fail,
                                  fresh_cases, kind)
from dlcourse.checks.core.stubs import not_written, stub_message
from dlcourse.checks.debug.reference import waited_on
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.debug.subjects import DebugConfig

# The sixth exercise's answer more: torch's own analyser of flight-recorder dumps (fr_trace and
# the modules that match the ranks' entries).
FLIGHT_ANSWERS = ANSWERS.but(torch=("torch.distributed.flight_recorder.fr_trace",
                                    "torch.distributed.flight_recorder.components.builder",
                                    "torch.distributed.flight_recorder.components.utils"))

WORLD_SIZE = 4
STEPS = 2  # data-parallel steps a rank makes when its data does not run out
GROUP_TIMEOUT_S = 2  # the hung group's timeout: how long the others wait
HINT = ("group each rank's entries by process group (pg_id); in each group, the last "
        "collective_seq_id each rank reached; the group where they differ is the one that hangs: "
        "the rank behind is the one the others wait on, and they wait in the call after its last")


class _DataRanOut(Exception):
    """The drawn rank stops here, as a rank with a shorter shard does."""


def hung_dumps(cases, timeout_s=GROUP_TIMEOUT_S):
    """Runs on every rank: for each case (odd rank, calls it makes on the group before it stops),
    the steps on a new group, then this rank's flight-recorder dump, keeping the default group's
    entries and this case's group's."""
    rank, dumps = dist.get_rank(), []
    grads = [torch.zeros_like(p) for p in DebugConfig().new_model().parameters()]  # 28 sizes
    groups = [dist.new_group(timeout=datetime.timedelta(seconds=timeout_s)) for _ in cases]
    for (odd, stop), group in zip(cases, groups):  # made first: a rendezvous waits on no hang
        made = 0
        try:
            for _ in range(STEPS):
                for grad in grads:  # lesson 03's naive DP: one all-reduce per parameter
                    if rank == odd and made == stop:
                        raise _DataRanOut
                    dist.all_reduce(grad, group=group)
                    made += 1
                dist.all_reduce(torch.zeros(1))  # the step's loss, on the default group
        except _DataRanOut:
            pass  # this rank goes on; the others wait in its next call
        except RuntimeError:
            pass  # the group's timeout ran out while this rank waited
        dumps.append(_kept(pickle.loads(torch._C._distributed_c10d._dump_fr_trace()), group))
        dist.barrier()  # the next case starts together (the default group waits 90 s, not 2)
    return dumps


def _kept(dump, group):
    """The dump with only the default group's and `group`'s entries (earlier cases' hung groups
    would make a second hang in the same dump)."""
    names = {dist.group.WORLD.group_name, group.group_name}
    dump["entries"] = [e for e in dump["entries"] if e["process_group"][0] in names]
    ids = {str(e["pg_id"]) for e in dump["entries"]}
    dump["pg_status"] = {k: v for k, v in dump.get("pg_status", {}).items() if k in ids}
    return dump


@functools.lru_cache(maxsize=2)  # `seed=` replays a check's run without running the job again
def recorded(cases, timeout=120):
    """[per rank: [per case: dump]] of `hung_dumps(cases)` on WORLD_SIZE gloo ranks: one launch
    (~3 s a case, most of it the 2 s the others wait)."""
    return dlcourse.launch(hung_dumps, list(cases), world_size=WORLD_SIZE, backend="gloo",
                           timeout=timeout)


def draw_cases(rng, calls_per_step):
    """[(odd rank, calls it makes before it stops)]: rank 0 once, another rank once, a third
    case either; one of them stops before the group's first call or at a step's end."""
    odds = [0, rng.randrange(1, WORLD_SIZE), rng.randrange(WORLD_SIZE)]
    edge = rng.choice([0, calls_per_step])  # no call at all, or one whole step made
    stops = [edge] + [rng.randrange(1, STEPS * calls_per_step) for _ in range(2)]
    rng.shuffle(stops)
    cases = list(zip(odds, stops))
    rng.shuffle(cases)
    return cases


@fresh_cases
def check_waited_call(waited_call, *, rng):
    """waited_call(dumps {rank: flight-recorder dump}) -> (rank, call): the rank the others wait
    on, and the collective_seq_id of the call they wait in (counted from 1 in its group)."""
    __tracebackhide__ = True
    expect_callable(waited_call, "waited_call")
    if stub_message(waited_call) is not None:  # a stub can only raise: say so, no run
        raise CheckFailed(not_written("waited_call", stub_message(waited_call)))
    _import_quietly("torch.distributed.flight_recorder.fr_trace")  # refused below, loaded here
    for dumps in _hangs(rng):  # the draw is not kept where the student's code could read it
        where = (f"waited_call on {WORLD_SIZE} ranks' flight-recorder dumps (up to "
                 f"{max(len(d['entries']) for d in dumps.values())} entries each)")
        got = call_in_process(waited_call, (copy.deepcopy(dumps),), exercise="waited_call",
                              where=where, guard=FLIGHT_ANSWERS.in_process, hint=HINT)
        _expect(got, waited_on(copy.deepcopy(dumps)), dumps, where)  # found after it returned
    print(f"waited_call: passed on 3 hangs of a real {WORLD_SIZE}-rank job (a rank "
          "whose data ran out, rank 0 in one; two process groups in every dump): each rank "
          "waited on and each call named")


def _hangs(rng):
    """[{rank: dump} per case] of a job drawn from `rng`, each checked against what the job did."""
    cases = draw_cases(rng, len(list(DebugConfig().new_model().parameters())))
    per_rank = recorded(tuple(cases))
    hangs = []
    for i, (odd, stop) in enumerate(cases):
        dumps = {r: per_rank[r][i] for r in range(WORLD_SIZE)}
        if waited_on(copy.deepcopy(dumps)) != (odd, stop + 1):  # the dumps show what was done
            raise RuntimeError(f"case {i}: the recorded dumps do not show rank {odd} stopping "
                               f"before call {stop + 1}")
        hangs.append(dumps)
    return hangs


def _import_quietly(module):
    """Import `module` without its warning that the optional `tabulate` is missing."""
    logging.disable(logging.WARNING)
    try:
        importlib.import_module(module)
    finally:
        logging.disable(logging.NOTSET)


def _read(got):
    """(rank, call) from a tuple or list, or a dict with those keys; or None."""
    if isinstance(got, dict):
        got = (got.get("rank"), got.get("call"))
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return None
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool)
               and float(v).is_integer() for v in got):
        return None
    return int(got[0]), int(got[1])


def _expect(got, want, dumps, where):
    __tracebackhide__ = True
    answer = _read(got)
    if answer is None:
        fail(where, None, f"returned {kind(got)} {got!r}, expected (rank, call): two whole "
                          "numbers", HINT)
    rank, call = answer
    w_rank, w_call = want
    if rank != w_rank:
        fail(where, None, f"returned rank {rank}, but the ranks wait on rank {w_rank}",
             "rank 0 can be the one behind: compare every rank's dump, not each with rank 0's"
             if w_rank == 0 else HINT)
    if call != w_call:
        fail(where, None, f"returned call {call}, but the others wait in call {w_call} of the "
                          f"hung group (its collective_seq_id)", _call_hint(call, w_call, rank,
                                                                             dumps))


def _call_hint(call, want, rank, dumps):
    if call == want - 1:
        return (f"call {call} is rank {rank}'s last call, which it made: the others wait in the "
                "next one, which it never made")
    ids = {e["record_id"] for d in dumps.values() for e in d["entries"]}
    if call in ids or call + 1 in ids:
        return ("record_id counts every entry of every group from 0: the call's number in its "
                "group is collective_seq_id")
    return HINT
