"""The answers lesson 10's checks grade with (`dlcourse/checks/debug/`), computed by the
lesson's own finders after the student's function has returned, and refused while it runs
(`answers.py`).

    first_gap(reference, trace)   (step, phase, name) of the first tensor that differs, or None
    odd_call(traces)              (rank, call, op, nbytes) of the call that makes the hang
    waited_on(dumps)              (rank, call) a hang waits on, from flight-recorder dumps
"""

from collections import Counter
from types import SimpleNamespace

from dlcourse.debug.compare import compare_trace
from dlcourse.debug.hang import find_hang


def first_gap(reference, trace):
    """The lesson's `compare_trace` on one rank's aligned traces (each pair already the same
    piece, the gradients in backward order): where the earliest gap above its tolerance is."""
    grads = next((list(r) for _, phase, r in reference if phase == "gradients"), [])
    whole = SimpleNamespace(piece=lambda ref: ref)  # the reference is cut to the rank's piece
    gaps, _ = compare_trace(reference, trace, grads, whole, None)
    if not gaps:
        return None
    g = min(gaps, key=lambda g: g["position"])
    return g["step"], g["phase"], g["name"]


def odd_call(traces):
    """The lesson's `find_hang` on {rank: [calls]}; of the first call the ranks disagree on, the
    one rank whose call (op and bytes, or none at all) no other rank made: (that rank, the
    call's number counted from 1 as the hang finder numbers it, its op and bytes, or None and
    None if it made none)."""
    mismatch = find_hang(traces)
    if mismatch is None:
        return None
    key = {r: (c["op"], c["nbytes"]) if c else None for r, c in mismatch.calls.items()}
    alone = [r for r, k in key.items() if Counter(key.values())[k] == 1]
    if len(alone) != 1:
        return None  # no single rank to blame: the check never draws such a case
    rank = alone[0]
    op, nbytes = key[rank] or (None, None)
    return rank, mismatch.index, op, nbytes


def waited_on(dumps):
    """From {rank: flight-recorder dump}: in the group whose ranks reached different last
    `collective_seq_id`s, the one rank behind the others and the call after its last, the one
    the others wait in; None if every group agrees or more than one rank is behind."""
    groups = {e["pg_id"] for d in dumps.values() for e in d["entries"]}
    for pg in sorted(groups):
        last = {r: max((e["collective_seq_id"] for e in d["entries"] if e["pg_id"] == pg),
                       default=0) for r, d in dumps.items()}  # 0: no call in this group
        behind = [r for r, n in last.items() if n < max(last.values())]
        if behind:
            return (behind[0], last[behind[0]] + 1) if len(behind) == 1 else None
    return None
