"""Check for lesson 10's first exercise (`exercises/10_debugging.ipynb`), a function called here
on real traces:

    check_first_divergence(first_divergence)   the first place a rank's run parts from one process

Every run of the catalogue's 2-rank bugs and of their strategies without a bug is recorded once
per process, on 2 gloo ranks (`runs.py`); each check draws four cases among them: three bugs,
each a different one, and one correct strategy, and for each the rank whose traces the student
reads. One of the bug cases is a witness, chosen by what its traces show: it parts first in an
activation or a gradient, another tensor of the same step and phase is wrong after it, and a
later gap is larger than the first; so reading only the parameters, walking a phase in another
order (the model's, by name) and naming the largest gap each name a later place, and fail.
The four drawn runs are then recorded again with weights and data drawn for this check's run
(`runs.traces_afresh`, one launch): the traces a student reads are never the same twice, so a
table of answers keyed by their values (collected from failures) finds nothing.

A few tensors before the first gap (anywhere, in the correct run) are nudged by 1e-14 of their
size, float64 rounding's order: a correct strategy adds in another order (some match exactly,
so the nudge makes sure an exact comparison is caught), and lesson 10's tolerance is there not
to count that. The answer is the lesson's own
comparison (`reference.first_gap`, on `compare_trace`), computed after the student's function
has returned (and, for the nudges, before it, not kept where the student's code could read it); while it runs the lesson's tool is refused (`answers.py`).
"""

import numbers

from dlcourse.checks.core import (CheckFailed, call_in_process, expect_callable, fail,
                                  fresh_cases, kind)
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.checks.debug.in_rank import place_as_data
from dlcourse.checks.debug.reference import first_gap
from dlcourse.checks.debug.runs import CORRECT, all_traces, traces_afresh
from dlcourse.checks.core.stubs import not_written, stub_message
from dlcourse.debug.compare import TOLERANCE
from dlcourse.debug.divergence import PHASES

NUDGE = 1e-14  # relative: float64 rounding's size (lesson 10 measured 3e-16 to 1.7e-15)
HINT = ("walk both traces in their order (step, then phase, then name) and stop at the first "
        "tensor whose largest |parallel - reference| exceeds tolerance x max(1, largest "
        "|reference|); None if none does")


@fresh_cases
def check_first_divergence(first_divergence, *, rng):
    """first_divergence(reference, parallel, tolerance) -> (step, phase, name) or None; each
    trace a list of (step, phase, {name: tensor}) as `dlcourse.debug` records it."""
    __tracebackhide__ = True
    expect_callable(first_divergence, "first_divergence")
    if stub_message(first_divergence) is not None:  # a stub can only raise: say so, no run
        raise CheckFailed(not_written("first_divergence", stub_message(first_divergence)))
    cases, witness = _draw(all_traces(), rng)
    runs = _afresh(cases, witness, rng)
    for name, bug, rank in cases:
        reference, trace = runs[(name, bug)][rank]
        trace = _nudged(trace, first_gap(reference, trace), rng)
        where = (f"first_divergence on rank {rank}'s traces of {name}"
                 + (f" with bug {bug!r}" if bug else " (correct)"))
        got = call_in_process(first_divergence, (_copy(reference), _copy(trace), TOLERANCE),
                              exercise="first_divergence", where=where,
                              guard=ANSWERS.in_process, hint=HINT, answer=place_as_data)
        _expect_place(got, first_gap(reference, trace), reference, trace, where)
    print(f"first_divergence: passed on {len(cases)} runs drawn at random "
          f"({', '.join(b or 'a correct strategy' for _, b, _ in cases)}; 2 ranks, 2 steps, "
          "float64): each first place where the run parts, or none, rounding not counted")


def _draw(runs, rng):
    """([(strategy, bug or None, rank)], the witness): three bug cases of different bugs, one
    of them a witness (see the module's docstring), and one correct strategy; in a random
    order. `runs` (one seed's) tell which cases are witnesses."""
    bug_cases = [(name, bug, rank) for (name, bug) in runs if bug for rank in range(2)]
    witnesses = [c for c in bug_cases if _witness(*runs[c[:2]][c[2]])]
    cases = [rng.choice(witnesses)]
    others = [c for c in bug_cases if c[1] != cases[0][1]]
    while len(cases) < 3:
        case = rng.choice(others)
        others = [c for c in others if c[1] != case[1]]
        cases.append(case)
    witness = cases[0]
    cases.append((rng.choice(CORRECT), None, rng.randrange(2)))
    rng.shuffle(cases)
    return cases, witness


def _afresh(cases, witness, rng):
    """The drawn cases' runs again with weights and data drawn from `rng` (so their values are
    no table's), where the witness is a witness too (nearly every seed; else the third)."""
    for _ in range(3):
        runs = traces_afresh(tuple(dict.fromkeys(c[:2] for c in cases)), rng.randrange(10**6))
        if _witness(*runs[witness[:2]][witness[2]]):
            break
    return runs


def _witness(reference, trace):
    """The case parts first in an activation or a gradient, with another tensor of that step and
    phase wrong after it, and a larger gap later than the first."""
    want = first_gap(reference, trace)
    if want is None or want[1].startswith("parameters"):
        return False
    gaps = [(place, gap[0]) for place in _places(reference)
            if (gap := _gap(reference, trace, place)) and gap[0] > gap[1]]
    first = next(d for place, d in gaps if place == want)
    same_entry = [p for p, _ in gaps if p[:2] == want[:2]]
    return len(same_entry) > 1 and any(d > first for _, d in gaps)


def _places(trace):
    return [(step, phase, name) for step, phase, tensors in trace for name in tensors]


def _copy(trace):
    return [(step, phase, {n: t.clone() for n, t in tensors.items()})
            for step, phase, tensors in trace]


def _positions(trace):
    return [(i, name) for i, (_, _, tensors) in enumerate(trace) for name in tensors]


def _nudged(trace, want, rng):
    """The trace with up to 3 tensors before the first gap (step 1 on: parameters before the
    step are copies) nudged by NUDGE of their largest value, at one element each."""
    trace = _copy(trace)
    places = []
    for i, name in _positions(trace):
        step, phase, tensors = trace[i]
        if want is not None and (step, phase, name) == want:
            break
        if step >= 1 and tensors[name].numel():
            places.append((i, name))
    for i, name in rng.sample(places, min(3, len(places))):
        t = trace[i][2][name].view(-1)
        k = int(t.abs().argmax())
        t[k] += NUDGE * max(1.0, float(t.abs().max()))
    return trace


def _read(got):
    """(step, phase, name) from a tuple or list, a dict or an object with those fields; or None."""
    if isinstance(got, dict):
        got = tuple(got.get(k) for k in ("step", "phase", "name"))
    elif all(hasattr(got, k) for k in ("step", "phase", "name")):
        got = (got.step, got.phase, got.name)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return None
    step, phase, name = got
    if not (isinstance(step, numbers.Real) and float(step).is_integer()):
        return None
    if not isinstance(phase, str) or not isinstance(name, str):
        return None
    phase = next((p for p in PHASES if p == phase.strip().lower()), phase)
    return int(step), phase, name


def _gap(reference, trace, place):
    """(|Δ| max, allowed) of `place` in the traces, or None if the traces hold no such tensor."""
    step, phase, name = place
    for (s, p, ref), (_, _, mine) in zip(reference, trace):
        if (s, p) == (step, phase) and name in ref:
            diff = (mine[name] - ref[name]).abs().max().item()
            return diff, TOLERANCE * max(1.0, ref[name].abs().max().item())
    return None


def _expect_place(got, want, reference, trace, where):
    __tracebackhide__ = True
    if got is None and want is None:
        return
    place = _read(got) if got is not None else None
    if got is not None and place is None:
        fail(where, None, f"returned {kind(got)} {got!r}, expected (step, phase, name) or None: "
                          f"step a whole number, phase one of {list(PHASES)}", HINT)
    if place == want:
        return
    if place is None:
        diff, allowed = _gap(reference, trace, want)
        fail(where, None, f"returned None, but {want} differs: max |Δ| {diff:.2e} > {allowed:.2e}",
             HINT)
    gap = _gap(reference, trace, place)
    if gap is None:
        fail(where, None, f"returned {place}, but the traces hold no such tensor (steps from 0, "
                          f"phases {list(PHASES)}, names as the traces spell them)", HINT)
    diff, allowed = gap
    if diff <= allowed:
        why = ("it is equal" if diff == 0 else f"it differs by {diff:.2e} only, within the "
               f"tolerance {allowed:.2e}: float64 rounding of a correct strategy, not a bug")
        fail(where, None, f"returned {place}, but {why}"
             + (f"; the first real gap is {want}" if want else "; this run has no divergence"),
             "compare |Δ| with tolerance x max(1, largest |reference|), never with 0"
             if diff else HINT)
    fail(where, None, f"returned {place}, which differs (max |Δ| {diff:.2e}), but an earlier "
                      f"tensor differs already: {want}", _later_hint(place, want))


def _later_hint(place, want):
    if place[1].startswith("parameters") and not want[1].startswith("parameters"):
        return ("a wrong parameter is the last symptom of a step: its activations and gradients "
                "come first in the trace; compare every phase, in the order given")
    if place[:2] == want[:2]:
        return ("within a phase keep the trace's order: the gradients are listed in the order "
                "backward finished them, the nearest to the loss first, not by size or name")
    return "the first place, not the largest gap: walk the trace in its order and stop at once"
