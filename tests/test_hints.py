"""Hints in levels (`dlcourse/checks/hints/`): each call one level further, never past the last."""

import pytest

from dlcourse.checks import hints


def test_each_call_shows_the_next_level_then_stays_at_the_last(capsys, monkeypatch):
    monkeypatch.setattr(hints, "_SHOWN", {})
    levels = hints.HINTS["ring_reduce_scatter"]
    for expected in list(range(2, len(levels) + 1)) + [len(levels)]:
        hints.hint("ring_reduce_scatter")
        out = capsys.readouterr().out
        assert out.startswith(f"ring_reduce_scatter, hint {expected} of {len(levels)}: "
                              f"{levels[expected - 1]}")
    hints.hint("ring_reduce_scatter", level=1)
    assert levels[0] in capsys.readouterr().out


def test_an_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="gather_all"):
        hints.hint("gather_everything")
