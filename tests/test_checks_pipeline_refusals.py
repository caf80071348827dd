"""Lesson 06's checks refuse the course's pipeline package and torch's schedules however they are
reached, a module added later included, and give them back afterwards."""

import inspect
import sys

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

from checking import first_line_and_hint
from dlcourse.checks.core import ForbiddenCall
from dlcourse.checks.core.answers import class_methods
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline import check_bubble_fraction


# --- refusing the answers ------------------------------------------------------------------

LIBRARY_SOURCE = '''
def bubble_fraction(n_stages, n_micro):
    return (n_stages - 1) / (n_micro + n_stages - 1)


class Schedule:
    def __init__(self, n_stages):
        self.n_stages = n_stages

    def bubble(self, n_micro):
        return (self.n_stages - 1) / (n_micro + self.n_stages - 1)
'''


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A pipeline package with a module added after the check module was imported: the checks
    walk the package when they run, so its answers are refused too."""
    package = tmp_path / "late_pipeline"
    (package / "schedules").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "schedules" / "__init__.py").write_text("")
    (package / "schedules" / "bubble.py").write_text(LIBRARY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ANSWERS, "packages", ("late_pipeline",))
    import late_pipeline.schedules.bubble as module
    yield module
    for name in [n for n in sys.modules if n.startswith("late_pipeline")]:
        del sys.modules[name]


def test_the_library_answer_is_refused_through_any_path(library):
    captured = library.bubble_fraction

    def by_module(n_stages, n_micro):
        return library.bubble_fraction(n_stages, n_micro)

    def by_default_argument(n_stages, n_micro, _answer=captured):
        return _answer(n_stages, n_micro)

    def by_class(n_stages, n_micro):
        return library.Schedule(n_stages).bubble(n_micro)

    schedule = library.Schedule(3)

    def by_instance_made_before(n_stages, n_micro):
        return schedule.bubble(n_micro)

    home = "from late_pipeline.schedules.bubble"
    for answer, refused in [(by_module, f"bubble_fraction {home}"),
                            (by_default_argument, f"bubble_fraction {home}"),
                            (by_class, f"Schedule {home}"),
                            (by_instance_made_before, f"Schedule.bubble {home}")]:
        first, _ = first_line_and_hint(check_bubble_fraction, answer)
        assert f"{refused}, which this exercise does not allow" in first, first
    assert captured(3, 5) == 2 / 7 and schedule.bubble(5) == 2 / 7  # given back afterwards


def test_every_answer_found_is_refused_while_the_guard_is_active_and_only_then():
    found = ANSWERS.objects()
    answers = [(each, fn) for name, value in found
               for each, fn in ([(name, value)] if inspect.isfunction(value)
                                else class_methods(name, value))
               if not fn.__closure__]
    answers += [key for key in ANSWERS.keys() if not key[1].__closure__]
    assert any("one_f_one_b from dlcourse.checks" in name for name, _ in answers)
    assert any("Schedule1F1B" in name for name, _ in answers)
    codes = [fn.__code__ for _, fn in answers]
    with ANSWERS.refusing():
        for name, fn in answers:
            with pytest.raises(ForbiddenCall, match=f"called {name}, which this exercise does"):
                fn()
    assert [fn.__code__ for _, fn in answers] == codes
    assert torch_schedules.get_schedule_class("1F1B") is torch_schedules.Schedule1F1B
