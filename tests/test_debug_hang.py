"""Lesson 10's hang finder (dlcourse/debug/hang.py): per-rank traces of every collective and
send/recv, lined up after a failed job, name the first call the ranks disagree on."""

import pytest

from dlcourse.debug import DebugConfig, find_hang, launch_traced
from dlcourse.debug.bugs import data_parallel_steps
from dlcourse.errors import RankError, RankTimeout

CFG = DebugConfig()
N_TENSORS = len(list(CFG.new_model().parameters()))  # all-reduces per step of average_gradients
BYTES = 8  # float64


def test_a_skipped_collective_names_the_call_the_other_rank_never_made():
    with pytest.raises(RankTimeout) as caught:
        # 5 s from joining: the two steps both ranks make take well under 1 s
        launch_traced(data_parallel_steps, "uneven_steps", n_steps=2, world_size=2, timeout=5)
    report = caught.value.hang_report
    assert report is not None and "hang finder" in str(caught.value)
    # two whole steps agree; rank 0's first all-reduce of a third step has no partner
    assert report.stream == "collectives on ranks [0, 1]"
    assert report.index == 2 * N_TENSORS + 1
    assert report.calls[1] is None
    call = report.calls[0]
    first = CFG.new_model().tok_emb.weight  # average_gradients starts with the first parameter
    assert (call["op"], call["nbytes"]) == ("all_reduce", first.numel() * BYTES)
    assert call["site"].endswith("(average_gradients)")
    assert "parallel/data/steps.py" in call["site"]


def test_a_size_mismatch_names_both_sizes():
    with pytest.raises(RankError) as caught:  # gloo aborts on the size; another backend may hang
        launch_traced(data_parallel_steps, "rank_dependent_size", world_size=2, timeout=10)
    report = caught.value.hang_report
    V, h = CFG.model.vocab_size, CFG.model.hidden
    assert report.index == 1  # the very first all-reduce: tok_emb's (V + rank, h) gradient
    assert {r: c["nbytes"] for r, c in report.calls.items()} == {0: V * h * BYTES,
                                                                  1: (V + 1) * h * BYTES}


def _call(op, nbytes, peer=None, group=(0, 1)):
    return dict(op=op, nbytes=nbytes, group=list(group), peer=peer, site="x.py:1 (f)")


def test_send_recv_streams_are_matched_by_pair_and_size():
    agree = {0: [_call("all_reduce", 64), _call("send", 32, peer=1)],
             1: [_call("all_reduce", 64), _call("recv", 32, peer=0)]}
    assert find_hang(agree) is None
    short = {0: agree[0], 1: [_call("all_reduce", 64), _call("recv", 16, peer=0)]}
    report = find_hang(short)
    assert report.stream == "send/recv 0 -> 1" and report.index == 1
    assert (report.calls[0]["nbytes"], report.calls[1]["nbytes"]) == (32, 16)


def test_the_earliest_disagreement_wins_over_a_later_one():
    traces = {0: [_call("broadcast", 8), _call("all_reduce", 64)],
              1: [_call("all_gather", 8), _call("all_reduce", 32)]}
    report = find_hang(traces)
    assert report.index == 1 and report.calls[0]["op"] == "broadcast"
