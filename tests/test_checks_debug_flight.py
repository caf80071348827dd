"""Lesson 10, exercise 6 (`dlcourse/checks/debug/waited_call.py`): from every rank's flight-recorder
dump of a real hung 4-rank gloo job, the rank the others wait on and the call they wait in.
Another way (each group's `pg_status`, numpy numbers in a dict) passes; reading rank 0's dump as
the model, naming the last call the rank made (off by one), taking `record_id` or an entry's
place in the list for the call's number fail with the hint that names the mistake; torch's own
analyser of the dumps is refused. The wrong answers share one seed, so one job serves them all
(`flight.recorded` keeps it)."""

import numpy as np
import pytest

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.debug import check_waited_call

SEED = 20261129  # draws rank 0 behind in one case, as every seed does, and another rank in one


def last_calls(dumps):
    """{pg_id: {rank: last collective_seq_id}} (0 where a rank made none in that group)."""
    groups = {e["pg_id"] for d in dumps.values() for e in d["entries"]}
    return {pg: {r: max((e["collective_seq_id"] for e in d["entries"] if e["pg_id"] == pg),
                        default=0) for r, d in dumps.items()} for pg in groups}


def waited_call(dumps):
    for last in last_calls(dumps).values():
        behind = [r for r, n in last.items() if n < max(last.values())]
        if behind:
            return behind[0], last[behind[0]] + 1


def from_pg_status(dumps):  # each rank's own summary of its groups, a dict of numpy numbers
    pgs = {pg for d in dumps.values() for pg in d["pg_status"]}
    for pg in pgs:
        last = {r: max(0, d["pg_status"].get(pg, {}).get("last_enqueued_collective", 0))
                for r, d in dumps.items()}
        if len(set(last.values())) > 1:
            rank = min(last, key=last.get)
            return {"rank": np.int64(rank), "call": np.int64(last[rank] + 1)}


def rank_zero_as_the_model(dumps):  # rank 0's last call taken as the one everybody waits in
    for pg, last in last_calls(dumps).items():
        for rank in sorted(dumps)[1:]:
            if last[rank] != last[0]:
                return rank, last[0]


def the_last_call_made(dumps):
    rank, call = waited_call(dumps)
    return rank, call - 1


def record_id(dumps):
    rank, call = waited_call(dumps)
    others = next(d for r, d in dumps.items() if r != rank)["entries"]
    return rank, others[-1]["record_id"]  # the blocked call's place in another rank's buffer


def place_in_the_list(dumps):  # every group's entries counted together
    counts = {r: len(d["entries"]) for r, d in dumps.items()}
    rank = min(counts, key=counts.get)
    return rank, counts[rank] + 1


def with_torch_s_analyser(dumps):
    from torch.distributed.flight_recorder.components.builder import build_db
    return build_db(dumps, None, None)


def test_another_way_passes(capsys):
    """The pg_status summaries instead of the entries (the solution's way passes in
    solutions/10_debugging.ipynb, under nbval)."""
    check_waited_call(from_pg_status, seed=SEED)
    assert "waited_call: passed on 3 hangs" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (rank_zero_as_the_model, "returned rank ", "rank 0 can be the one behind"),
    (the_last_call_made, "returned call ", "is rank"),
    (record_id, "returned call ", "record_id counts every entry"),
    (place_in_the_list, "returned call ", ""),
])
def test_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_waited_call, answer, seed=SEED)
    assert first.startswith("waited_call on 4 ranks' flight-recorder dumps"), first
    assert first.split("): ", 1)[1].startswith(says), first
    assert hint in got_hint, got_hint


def test_torch_s_analyser_is_refused():
    first, _ = first_line_and_hint(check_waited_call, with_torch_s_analyser, seed=SEED)
    assert "called build_db" in first, first


def test_a_submission_passes_when_graded(capsys):
    """As `dlcourse grade` runs it: on a rank of its own, the dict of numpy numbers read back."""
    check_waited_call(Submitted("waited_call", pickling.dumps(from_pg_status)), seed=SEED)
    assert "waited_call: passed" in capsys.readouterr().out


def from_the_checks_frames(dumps):  # called here (a notebook's grader cell): the check's locals
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        for name in ("want", "odd", "stop", "cases"):
            if name in frame.f_locals:
                return frame.f_locals[name]
        frame = frame.f_back
    return None


def test_neither_the_draw_nor_the_answer_is_kept_where_the_student_s_code_runs():
    first, _ = first_line_and_hint(check_waited_call, from_the_checks_frames, seed=SEED)
    assert "returned None None, expected (rank, call)" in first, first
