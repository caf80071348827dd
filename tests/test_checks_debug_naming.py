"""Lesson 10, exercise 4 (`dlcourse/checks/debug/name_the_bug.py`): a run with a catalogue bug drawn
at random; the student names its first place over the ranks and the bug. Reasoning from what the
gap looks like passes every draw, and so does a key spelled with other case and spaces; always
the same key, a table from (strategy, first place) to a key (the twins share one), a later place
than the first, rank 0's traces only, the lesson's finder, and peeking at the check's state all
fail, each with the hint that names the mistake.

The wrong answers share one seed that draws dp_no_broadcast (the bug that shows on rank 1
first), so its runs are recorded once (`name_the_bug.recorded` keeps the last two)."""

import random
import sys

import pytest
import torch

from checking import first_line_and_hint
from dlcourse.checks.debug import check_name_the_bug
from dlcourse.checks.debug.name_the_bug import draw_bugs


def first_divergence(reference, parallel, tolerance):
    for (step, phase, ref), (_, _, mine) in zip(reference, parallel):
        for name, want in ref.items():
            if (mine[name] - want).abs().max() > tolerance * max(1.0, want.abs().max().item()):
                return step, phase, name
    return None


LOOKS = {"dp_no_broadcast": "apart", "tp_row_bias_per_rank": "forward",
         "tp_f_backward_not_summed": "ranks disagree", "dp_grads_summed": "constant",
         "pp_loss_not_divided": "constant", "uneven_batch_unweighted": "no multiple",
         "pp_tied_embeddings_unsynced": "no multiple"}


def earliest(case, ranks=None):
    found = []
    for rank in ranks or case["traces"]:
        reference, parallel = case["traces"][rank]
        place = first_divergence(reference, parallel, case["tolerance"])
        if place is not None:
            entry = next(i for i, (s, p, _) in enumerate(reference) if (s, p) == place[:2])
            found.append((entry, list(reference[entry][2]).index(place[2]), place))
    entry, _, place = min(found)
    return entry, place


def look(case, entry, place):
    step, phase, name = place
    if step == 0 or phase == "activations":
        return "apart" if step == 0 else "forward"
    got = [parallel[entry][2][name] for _, parallel in case["traces"].values()]
    if any(not torch.allclose(g, got[0], rtol=1e-9, atol=0) for g in got):
        return "ranks disagree"
    want = case["traces"][0][0][entry][2][name]
    c = (got[0] * want).sum() / (want * want).sum()
    off = (got[0] - c * want).abs().max() / want.abs().max()
    return "constant" if off < 1e-6 else "no multiple"


def reasoned(case, ranks=None):
    entry, place = earliest(case, ranks)
    return place, next(b for b in case["candidates"] if LOOKS[b] == look(case, entry, place))


def name_the_bug(case):
    return reasoned(case)


def spelled_otherwise(case):  # a dict, the key in capitals with spaces
    place, bug = reasoned(case)
    return {"place": list(place), "bug": "  " + bug.upper().replace("_", " ")}


def always_the_same(case):
    return reasoned(case)[0], "dp_grads_summed"


# the catalogue's first places (tests/test_debug_catalogue.py), keyed with the strategy
BY_PLACE = {("DP overlapped (lesson 03)", "parameters before step 1"): "dp_no_broadcast",
            ("DP overlapped (lesson 03)", "ln_f.weight"): "dp_grads_summed",
            ("PP 1F1B (lesson 06)", "ln_f.weight"): "pp_loss_not_divided",
            ("PP 1F1B (lesson 06)", "tok_emb.weight"): "pp_tied_embeddings_unsynced",
            ("TP (lesson 04)", "blocks.0.attn.proj"): "tp_row_bias_per_rank",
            ("TP (lesson 04)", "ln_f.weight"): "tp_f_backward_not_summed"}


def by_first_place(case):
    _, place = earliest(case)
    what = place[1] if place[0] == 0 else place[2]
    return place, BY_PLACE[(case["strategy"], what)]


def a_later_place(case):  # the last tensor that differs in the first entry that differs
    entry, place = earliest(case)
    reference, parallel = next(t for t in case["traces"].values()
                               if first_divergence(*t, case["tolerance"]) == place)
    step, phase, ref = reference[entry]
    last = [n for n in ref if (parallel[entry][2][n] - ref[n]).abs().max()
            > case["tolerance"] * max(1.0, ref[n].abs().max().item())][-1]
    return (step, phase, last), reasoned(case)[1]


def rank_zero_only(case):
    return reasoned(case, ranks=[0])


def with_the_finder(case):
    from dlcourse.debug import find_divergence
    return find_divergence(case["strategy"]).first, None


def peeking(case):  # the check's locals up the stack, its cache of runs: none is in this rank
    from dlcourse.checks.debug import name_the_bug as check_module
    found = [f.f_locals[n] for f in _frames() for n in ("bug", "want", "drawn") if n in f.f_locals]
    cached = check_module.recorded.cache_info().currsize
    return earliest(case)[1], found[0] if found else f"nothing found, {cached} runs cached"


def _frames():
    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _seed_drawing(bug):
    return next(s for s in range(1000) if bug in [b for _, b in draw_bugs(random.Random(s))])


SEED = _seed_drawing("dp_no_broadcast")  # the wrong answers' draw


@pytest.mark.parametrize("answer, seed", [(name_the_bug, None), (spelled_otherwise, SEED)])
def test_reasoning_from_the_gap_passes(answer, seed, capsys):
    check_name_the_bug(answer, seed=seed)  # None: a fresh draw
    assert "name_the_bug: passed on 4 runs" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (always_the_same, "named the bug 'dp_grads_summed', but", ""),
    (by_first_place, "named the bug 'dp_grads_summed', but this run's bug is another of",
     "tell them apart by the gap itself"),
    (a_later_place, "but an earlier tensor differs already", ""),
    (rank_zero_only, "rank 0's first place, but rank 1 parts earlier",
     "a bug may show on some ranks only"),
    (with_the_finder, "called find_divergence from dlcourse.debug.divergence, which this "
                      "exercise does not allow", ""),
    (peeking, "which is not one of this run's candidates", "return the catalogue key"),
])
def test_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_name_the_bug, answer, seed=SEED)
    assert first.startswith("name_the_bug on a run of ") and says in first, first
    assert hint in got_hint, got_hint


def test_an_unwritten_first_divergence_is_named_not_name_the_bug():
    # exercise 1 still the stub `dlcourse exercises build` writes; name_the_bug calls it
    def first_divergence(reference, parallel, tolerance):
        raise NotImplementedError("Hint: walk the traces")

    def calls_the_stub(case):
        return first_divergence(*case["traces"][0], case["tolerance"]), "dp_grads_summed"

    first, _ = first_line_and_hint(check_name_the_bug, calls_the_stub, seed=SEED)
    assert first.startswith("first_divergence is not written yet (calls_the_stub calls it)"), first


def as_a_dataclass(case):
    from dataclasses import dataclass

    @dataclass
    class Place:
        step: int
        phase: str
        name: str

    place, bug = reasoned(case)
    return Place(*place), bug


def test_a_dataclass_place_passes_when_graded(capsys):  # the rank sends back data only
    from dlcourse import pickling
    from dlcourse.checks.core import Submitted
    check_name_the_bug(Submitted("name_the_bug", pickling.dumps(as_a_dataclass)), seed=SEED)
    assert "name_the_bug: passed on 4 runs" in capsys.readouterr().out
