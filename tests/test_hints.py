"""Hints in levels (`dlcourse/checks/hints.py`, each set's table in
`dlcourse/checks/<set>/hints.py`): each call one level further, never past the last."""

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


def test_a_hint_is_found_in_its_own_sets_table_and_only_there():
    """Each exercise id is in one set's table; `levels_of` finds it there."""
    from dlcourse.lessons import LESSONS
    seen = {}
    for entry in LESSONS:
        for exercise, levels in hints.of_set(entry.name).items():
            assert exercise not in seen, (exercise, seen.get(exercise), entry.name)
            seen[exercise] = entry.name
            assert hints.levels_of(exercise) is levels
    assert seen["shard_of"] == "zero" and seen["resume_state"] == "checkpoint"
