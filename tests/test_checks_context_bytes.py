"""Lesson 08's check of cp_bytes_per_layer (`dlcourse/checks/context/cp_bytes_per_layer.py`): cases
drawn per run (every method, 2 to 8 ranks) against the lesson's layer_formula turned into bytes
sent; correct answers of other plain types pass, the usual miscounts fail with their hint, and
the lesson's formulas and the check's reference are refused."""

from types import SimpleNamespace

import numpy as np
import pytest

from checking import first_line_and_hint
from dlcourse.checks.context import check_cp_bytes_per_layer
from dlcourse.checks.context.cp_bytes_per_layer import reference_bytes
from dlcourse.parallel.context.measure import layer_bytes_sent


def cp_bytes_per_layer(method, cp, batch, seq_len, hidden, itemsize):  # the solution notebook's
    bsh = batch * seq_len * hidden * itemsize
    if method in ("ring", "zigzag"):
        block = 2 * bsh // cp
        return {"forward": (cp - 1) * block, "backward": 2 * (cp - 1) * block}
    if method == "ulysses":
        sent = 4 * (cp - 1) * bsh // cp**2
        return {"forward": sent, "backward": sent}
    sent = (cp - 1) * 2 * bsh // cp
    return {"forward": sent, "backward": sent}


def in_numpy_as_a_pair(method, cp, batch, seq_len, hidden, itemsize):
    answer = cp_bytes_per_layer(method, cp, np.int64(batch), seq_len, hidden, itemsize)
    return np.int64(answer["forward"]), np.int64(answer["backward"])


def in_floats(method, cp, batch, seq_len, hidden, itemsize):  # (cp-1)/cp rounded in floats
    share = (cp - 1) / cp
    values = batch * seq_len * hidden
    per_pass = {"ring": 2 * values / cp * (cp - 1), "zigzag": 2 * values / cp * (cp - 1),
                "ulysses": 4 * share * values / cp, "allgather": share * 2 * values}[method]
    backward = 2 * per_pass if method in ("ring", "zigzag") else per_pass
    return {"backward": backward * itemsize, "forward": per_pass * itemsize}


@pytest.mark.parametrize("answer", [cp_bytes_per_layer, in_numpy_as_a_pair, in_floats])
def test_correct_answers_pass(answer, capsys):
    check_cp_bytes_per_layer(answer)
    out = capsys.readouterr().out
    assert "cp_bytes_per_layer: passed on 8 cases" in out and "ulysses" in out


@pytest.mark.parametrize("cp", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("method", ["ring", "zigzag", "ulysses", "allgather"])
def test_the_reference_adds_up_to_the_bytes_the_lesson_measures(method, cp):
    """layer_bytes_sent is written in closed form and tests/test_context_parallel.py checks it
    against the bytes counted on real ranks; the reference comes from the messages instead."""
    b, s, h, e = 3, 2 * cp * 5, cp * 6, 2
    ours = reference_bytes(method, cp, b, s, h, e)
    total = layer_bytes_sent(SimpleNamespace(seq_len=s, hidden=h), b, cp, method, e)
    assert float(ours["forward"] + ours["backward"]) == pytest.approx(total, rel=1e-12)
    assert ours["forward"].denominator == ours["backward"].denominator == 1


def with_cp_messages(method, cp, *args):  # the ring's own block counted as sent
    answer = cp_bytes_per_layer(method, cp, *args)
    if method in ("ring", "zigzag"):
        return {p: v // (cp - 1) * cp for p, v in answer.items()}
    return answer


def backward_one_pass(method, cp, *args):
    answer = cp_bytes_per_layer(method, cp, *args)
    return {"forward": answer["forward"], "backward": answer["forward"]}


def ulysses_whole_tensor(method, cp, batch, seq_len, hidden, itemsize):
    if method == "ulysses":
        sent = 4 * batch * seq_len * hidden * itemsize // cp
        return {"forward": sent, "backward": sent}
    return cp_bytes_per_layer(method, cp, batch, seq_len, hidden, itemsize)


def only_for_four_ranks(method, cp, *args):  # the lesson's cp = 4 written in
    return cp_bytes_per_layer(method, 4, *args)


def in_values(method, cp, batch, seq_len, hidden, itemsize):
    return cp_bytes_per_layer(method, cp, batch, seq_len, hidden, 1)


def allgather_whole(method, cp, batch, seq_len, hidden, itemsize):
    if method == "allgather":
        sent = 2 * batch * seq_len * hidden * itemsize
        return {"forward": sent, "backward": sent}
    return cp_bytes_per_layer(method, cp, batch, seq_len, hidden, itemsize)


@pytest.mark.parametrize("wrong, says, hint", [
    (with_cp_messages, "forward is", "sends cp - 1 blocks, not cp"),
    (backward_one_pass, "backward is", "backward is two passes around the ring"),
    (ulysses_whole_tensor, "method='ulysses'", "keeps 1/cp of each rank's tensor"),
    (only_for_four_ranks, "", "that is the answer for cp = 4"),
    (in_values, "", "these are values, not bytes"),
    (allgather_whole, "method='allgather'", "it sends (cp - 1)/cp of that"),
])
def test_miscounts_fail_with_their_hint(wrong, says, hint):
    first, rest = first_line_and_hint(check_cp_bytes_per_layer, wrong)
    assert first.startswith("cp_bytes_per_layer(method=") and says in first
    assert "expected" in first and hint in rest


@pytest.mark.parametrize("wrong, says", [
    (lambda *args: "a lot", "returned a str, expected {'forward'"),
    (lambda *args: {"fwd": 1, "bwd": 2}, "expected exactly 'forward' and 'backward'"),
    (lambda *args: {"forward": 1, "backward": None}, "returned None as backward"),
])
def test_answers_of_the_wrong_shape_are_named(wrong, says):
    first, _ = first_line_and_hint(check_cp_bytes_per_layer, wrong)
    assert says in first


def from_the_lesson(method, cp, batch, seq_len, hidden, itemsize):
    from dlcourse.parallel.context.measure import layer_formula
    layer_formula(SimpleNamespace(seq_len=seq_len, hidden=hidden), batch, cp, method)


def from_the_check(*args):
    from dlcourse.checks.context import cp_bytes_per_layer as check
    return check.reference_bytes(*args)


@pytest.mark.parametrize("wrong, says", [
    (from_the_lesson, "layer_formula from dlcourse.parallel.context.measure"),
    (from_the_check, "reference_bytes from dlcourse.checks.context.cp_bytes_per_layer"),
])
def test_the_answers_are_refused(wrong, says):
    first, _ = first_line_and_hint(check_cp_bytes_per_layer, wrong)
    assert says in first and "which this exercise does not allow" in first
