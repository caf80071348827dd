"""Lesson 09, exercise 5 (`dlcourse/checks/expert/a2a_bytes_per_layer.py`): the bytes one rank sends
in an MoE layer's all-to-alls, forward and backward, under uniform routing. Correct answers of any
plain type pass (numpy integers, Fractions, floats computed in another order); each wrong count
fails with the hint that names the mistake; the lesson's formula is refused while the answer
runs."""

from fractions import Fraction

import numpy as np
import pytest

from checking import first_line_and_hint, starts
from dlcourse import pickling
from dlcourse.checks.core import Submitted
from dlcourse.checks.expert import check_a2a_bytes_per_layer
from dlcourse.checks.expert.a2a_bytes_per_layer import expected_bytes


def a2a_bytes_per_layer(tokens, hidden, top_k, ep, itemsize):
    one = top_k * tokens * hidden * itemsize * (ep - 1) // ep  # one all-to-all, off the rank
    return {"forward": 2 * one, "backward": 2 * one}


def in_numpy(tokens, hidden, top_k, ep, itemsize):
    rows = np.int64(top_k) * tokens * (ep - 1) // ep  # rows that leave, per all-to-all
    bytes_ = np.prod([np.int64(2), rows, hidden, itemsize])
    return {"forward": 2 * rows * hidden * itemsize, "backward": bytes_}


def as_fractions(tokens, hidden, top_k, ep, itemsize):
    one = Fraction(ep - 1, ep) * top_k * tokens * hidden * itemsize
    return {"forward": 2 * one, "backward": one + one}


def as_floats(tokens, hidden, top_k, ep, itemsize):  # the share first: not exact in float64
    one = (ep - 1) / ep * top_k * tokens * hidden * itemsize
    return {"forward": 2.0 * one, "backward": 2.0 * one}


def every_row(tokens, hidden, top_k, ep, itemsize):
    one = top_k * tokens * hidden * itemsize
    return {"forward": 2 * one, "backward": 2 * one}


def no_top_k(tokens, hidden, top_k, ep, itemsize):
    return a2a_bytes_per_layer(tokens, hidden, 1, ep, itemsize)


def one_all_to_all_per_pass(tokens, hidden, top_k, ep, itemsize):
    one = top_k * tokens * hidden * itemsize * (ep - 1) // ep
    return {"forward": one, "backward": one}


def right_for_ep_4(tokens, hidden, top_k, ep, itemsize):
    one = top_k * tokens * hidden * itemsize * 3 / 4
    return {"forward": 2 * one, "backward": 2 * one}


def values_not_bytes(tokens, hidden, top_k, ep, itemsize):
    return a2a_bytes_per_layer(tokens, hidden, top_k, ep, 1)


def a_tuple(tokens, hidden, top_k, ep, itemsize):
    got = a2a_bytes_per_layer(tokens, hidden, top_k, ep, itemsize)
    return got["forward"], got["backward"]


def with_the_lessons_formula(tokens, hidden, top_k, ep, itemsize):
    from types import SimpleNamespace
    from dlcourse.parallel.expert.measure import all_to_all_formula
    one = all_to_all_formula(SimpleNamespace(top_k=top_k, seq_len=tokens, hidden=hidden), 1, ep,
                             itemsize)
    return {"forward": 2 * one, "backward": 2 * one}


def test_the_reference_is_twice_the_formula_by_hand():
    # 12 tokens, top-2, on 3 ranks: 24 rows, 8 stay, 16 leave; 5 values of 4 bytes each; x2
    assert expected_bytes(12, 5, 2, 3, 4) == 2 * 16 * 5 * 4


@pytest.mark.parametrize("answer", [a2a_bytes_per_layer, in_numpy, as_fractions, as_floats])
def test_correct_answers_of_any_plain_type_pass(answer, capsys):
    check_a2a_bytes_per_layer(answer)
    assert "a2a_bytes_per_layer: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (every_row, "1/ep of them go to its own experts"),
    (no_top_k, "sent as top_k rows"),
    (one_all_to_all_per_pass, "two all-to-alls of rows"),
    (right_for_ep_4, "right for ep = 4 only"),
    (values_not_bytes, "bytes, not values"),
])
def test_wrong_counts_fail_with_the_hint_that_names_them(answer, hint):
    first, got_hint = first_line_and_hint(check_a2a_bytes_per_layer, answer)
    assert starts(first, "a2a_bytes_per_layer(tokens=") and "bytes, expected" in first, first
    assert hint in got_hint, (first, got_hint)


def test_another_shape_of_answer_is_named():
    first, _ = first_line_and_hint(check_a2a_bytes_per_layer, a_tuple)
    assert 'returned a tuple, expected a dict {"forward": bytes' in first, first


def test_the_lessons_formula_is_refused():
    first, _ = first_line_and_hint(check_a2a_bytes_per_layer, with_the_lessons_formula)
    assert "called all_to_all_formula from dlcourse.parallel.expert.measure" in first, first


@pytest.mark.parametrize("answer", [in_numpy, as_fractions])
def test_plain_types_pass_when_graded(answer, capsys):
    """As `dlcourse grade` runs it: on a rank, numpy integers and Fractions read back as data."""
    check_a2a_bytes_per_layer(Submitted("a2a_bytes_per_layer", pickling.dumps(answer)))
    assert "a2a_bytes_per_layer: passed" in capsys.readouterr().out


def rebuilt_from_the_lessons_file(tokens, hidden, top_k, ep, itemsize):  # exec'd from its text
    from types import SimpleNamespace

    import dlcourse.parallel.expert.measure as lesson
    namespace = {}
    exec(compile(open(lesson.__file__).read(), "a copy", "exec"), namespace)
    config = SimpleNamespace(top_k=top_k, seq_len=tokens, hidden=hidden)
    one = namespace["all_to_all_formula"](config, 1, ep, itemsize)
    return {"forward": 2 * one, "backward": 2 * one}


def test_the_lessons_formula_rebuilt_from_its_file_while_it_runs_is_refused():
    first, _ = first_line_and_hint(check_a2a_bytes_per_layer, rebuilt_from_the_lessons_file)
    copied = first.split(" from dlcourse.parallel.expert.measure")[0]  # every refused function
    assert "exec'd a copy of " in copied and "all_to_all_formula" in copied, first


def rebuilt_with_the_hook_off(tokens, hidden, top_k, ep, itemsize):
    import sys
    sys.setprofile(None)
    return rebuilt_from_the_lessons_file(tokens, hidden, top_k, ep, itemsize)


def test_the_hook_that_refuses_a_rebuilt_copy_cannot_be_switched_off():
    first, _ = first_line_and_hint(check_a2a_bytes_per_layer, rebuilt_with_the_hook_off)
    assert "called sys.setprofile, which this exercise does not allow" in first, first
