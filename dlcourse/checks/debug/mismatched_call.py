"""Check for lesson 10's second exercise (`exercises/10_debugging.ipynb`), a function called here
on per-rank collective traces:

    check_mismatched_call(mismatched_call)   the rank and the call that leave the others waiting

The traces are a real 4-rank job's (`runs.clean_calls`: lesson 10's data-parallel steps, traced
by `CommTrace`), each case broken on one rank drawn at random (rank 0 in one case) in one of
five ways: it skips a call, sends another size, makes another collective, makes one call more
than the others (uneven data), or stops one call early. Every trace ends where its rank would
wait. The answer is the lesson's own `find_hang`, read after the student's function has
returned (`reference.odd_call`); while it runs the lesson's tool is refused (`answers.py`).
"""

import copy
import numbers

from dlcourse.checks.core import (CheckFailed, call_in_process, expect_callable, fail,
                                  fresh_cases, kind)
from dlcourse.checks.debug.reference import odd_call
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.checks.debug.runs import clean_calls
from dlcourse.checks.core.stubs import not_written, stub_message

KINDS = ("skips a call", "sends another size", "makes another collective", "makes one call more",
         "stops one call early")
HINT = ("line the ranks' lists up call by call; at each index compare every rank's (op, nbytes), "
        "or that it has no call there; the first index where they are not all alike is the "
        "place (name it counted from 1), and the rank whose call no other rank made is the one "
        "to name")


@fresh_cases
def check_mismatched_call(mismatched_call, *, rng):
    """mismatched_call(traces {rank: [call dicts]}) -> (rank, call, op, nbytes): the rank whose
    call no other rank made, that call's number in its list counted from 1 (as the hang finder
    and torch's flight recorder count), and its op and bytes (None, None where it made none)."""
    __tracebackhide__ = True
    expect_callable(mismatched_call, "mismatched_call")
    if stub_message(mismatched_call) is not None:  # a stub can only raise: say so, no run
        raise CheckFailed(not_written("mismatched_call", stub_message(mismatched_call)))
    calls = clean_calls()
    world_size = len(calls)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    zero = rng.randrange(len(kinds))  # the case where rank 0 is the odd one
    for i, how in enumerate(kinds):
        odd = 0 if i == zero else rng.randrange(1, world_size)
        traces, index = _broken(calls[0], world_size, odd, how, rng)
        longest = max(len(calls) for calls in traces.values())
        where = (f"mismatched_call on {world_size} ranks' traces (up to {longest} calls; one rank "
                 f"{how})")
        got = call_in_process(mismatched_call, (copy.deepcopy(traces),),
                              exercise="mismatched_call", where=where,
                              guard=ANSWERS.in_process, hint=HINT)
        _expect_call(got, odd_call(copy.deepcopy(traces)), traces, where)  # found after it
    print(f"mismatched_call: passed on {len(kinds)} hangs drawn at random ({world_size} ranks; a "
          "rank that skips a call, sends another size, makes another collective, one call more "
          "or one fewer; rank 0 the odd one in one): each rank and call named")


def _broken(clean, world_size, odd, how, rng):
    """({rank: calls} with rank `odd` broken `how`, each list ending where its rank waits;
    the number, from 1, of the first call that differs)."""
    n = len(clean)
    while True:  # a place where the next call differs from this one (op or bytes)
        i = rng.randrange(1, n - 1)
        if (clean[i]["op"], clean[i]["nbytes"]) != (clean[i + 1]["op"], clean[i + 1]["nbytes"]):
            break
    others = clean[:i + 1]
    if how == "skips a call":
        mine = clean[:i] + [clean[i + 1]]
    elif how == "sends another size":
        mine = clean[:i] + [dict(clean[i], nbytes=clean[i]["nbytes"] + 4 * rng.randint(1, 64))]
    elif how == "makes another collective":
        mine = clean[:i] + [dict(clean[i], op=rng.choice(["broadcast", "all_gather", "reduce"]))]
    elif how == "makes one call more":
        i, others = n, clean
        mine = clean + [clean[0]]  # a third step's first all-reduce
    else:  # stops one call early
        mine = clean[:i]
    traces = {r: copy.deepcopy(mine if r == odd else others) for r in range(world_size)}
    return traces, i + 1


def _whole(value):
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and float(value).is_integer())


def _read(got):
    """(rank, call, op, nbytes) from a tuple or list, or a dict with those keys; or None."""
    if isinstance(got, dict):
        got = tuple(got.get(k) for k in ("rank", "call", "op", "nbytes"))
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        return None
    rank, index, op, nbytes = got
    if not (_whole(rank) and _whole(index)) or not (op is None or isinstance(op, str)):
        return None
    if not (nbytes is None or _whole(nbytes)):
        return None
    return int(rank), int(index), op, None if nbytes is None else int(nbytes)


def _expect_call(got, want, traces, where):
    __tracebackhide__ = True
    if got is None:
        fail(where, None, f"returned None, but the ranks disagree: rank {want[0]}'s call "
                          f"{want[1]} is one no other rank makes",
             "compare both the op and nbytes of every rank's call, and a list that ends early "
             "(no call) as a value of its own")
    answer = _read(got)
    if answer is None:
        fail(where, None, f"returned {kind(got)} {got!r}, expected (rank, call, op, nbytes): "
                          "whole numbers and the op's name (None, None where the rank made no "
                          "call)", HINT)
    rank, index, op, nbytes = answer
    w_rank, w_index, w_op, w_nbytes = want
    if rank != w_rank:
        fail(where, None, f"returned rank {rank}, but rank {w_rank}'s call {w_index} is the one "
                          "no other rank makes", _rank_hint(rank, w_rank, traces, w_index))
    if index != w_index:
        fail(where, None, f"returned call {index} of rank {rank}, but the first call the ranks "
                          f"disagree on is call {w_index} (counted from 1)",
             _index_hint(index, w_index))
    if (op, nbytes) != (w_op, w_nbytes):
        made = traces[w_rank][w_index - 1] if w_index <= len(traces[w_rank]) else None
        said = "made no such call" if made is None else f"made {w_op} of {w_nbytes} B"
        fail(where, None, f"returned ({op!r}, {nbytes!r}), but rank {w_rank} {said} there",
             "name the odd rank's own call, not the one the others made"
             if made is not None else "a rank with no call there: return None, None")


def _rank_hint(rank, want, traces, index):
    if want == 0:
        return ("rank 0 can be the odd one too: find the call no other rank made, "
                "rather than comparing each rank with rank 0")
    lengths = {len(c) for c in traces.values()}
    if len(lengths) == 1:
        return ("every list here has the same length: compare the calls' op and nbytes, "
                "not only how many calls each rank made")
    return HINT


def _index_hint(index, want):
    if index == want - 1:
        return ("count from 1, as the hang finder and torch's flight recorder "
                "(collective_seq_id) number a group's calls: a list's index 0 is call 1")
    return HINT
