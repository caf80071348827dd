"""The answers lesson 10's checks grade with (`dlcourse/checks/debugging/`), computed by the
lesson's own finders after the student's function has returned, and refused while it runs
(`refusal.py`).

    first_gap(reference, trace)   (step, phase, name) of the first tensor that differs, or None
    odd_call(traces)              (rank, index, op, nbytes) of the call that makes the hang
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
    call's index in its list from 0, its op and bytes, or None and None if it made none)."""
    mismatch = find_hang(traces)
    if mismatch is None:
        return None
    key = {r: (c["op"], c["nbytes"]) if c else None for r, c in mismatch.calls.items()}
    alone = [r for r, k in key.items() if Counter(key.values())[k] == 1]
    if len(alone) != 1:
        return None  # no single rank to blame: the check never draws such a case
    rank = alone[0]
    op, nbytes = key[rank] or (None, None)
    return rank, mismatch.index - 1, op, nbytes
