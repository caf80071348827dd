"""The one answer-blocking engine (`dlcourse/checks/core/answers.py`) on a stand-in lesson package
and a stand-in check module: what a declaration finds, that each answer refuses however it is
reached while the block is active, and that everything is put back afterwards. (The lessons'
tests show their real answers refused in the ranks and in process the same ways.)"""

import contextlib
import sys
import types

import pytest
import torch

from dlcourse.checks.core.answers import WHY_KEY, Answers
from dlcourse.checks.core.refuse import ForbiddenCall

LIBRARY = '''
import functools
import torch

def decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper

class Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad

class Plan:
    def __init__(self, n):
        self.n = n

    def bubble(self, m):
        return (self.n - 1) / (m + self.n - 1)

def answer(x):
    return x

@decorated
def wrapped_answer(x):
    return x

def _private(x):
    return x
'''

CHECK = '''
def reference(x):
    return x

def helper(x):
    return x
'''


@pytest.fixture
def lesson(tmp_path, monkeypatch):
    """A package `late_lesson` (one module, in a subpackage) and a check module `late_check`,
    written after dlcourse was imported: the engine walks them when it refuses."""
    (tmp_path / "late_lesson" / "sub").mkdir(parents=True)
    (tmp_path / "late_lesson" / "__init__.py").write_text("")
    (tmp_path / "late_lesson" / "sub" / "__init__.py").write_text("")
    (tmp_path / "late_lesson" / "sub" / "code.py").write_text(LIBRARY)
    (tmp_path / "late_check.py").write_text(CHECK)
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_check
    import late_lesson.sub.code as code
    yield code, late_check
    for name in [n for n in sys.modules if n.startswith(("late_lesson", "late_check"))]:
        del sys.modules[name]


def test_a_declaration_finds_the_public_functions_and_classes_and_the_checks_functions(lesson):
    answers = Answers(packages=("late_lesson",), checks=("late_check",), allow=("helper",))
    home = "from late_lesson.sub.code"
    assert {name for name, _ in answers.objects()} == {
        f"{n} {home}" for n in ("decorated", "Split", "Plan", "answer", "wrapped_answer")}
    assert [name for name, _ in answers.keys()] == ["reference from late_check"]


def test_every_way_to_an_answer_is_refused_and_put_back(lesson):
    code, _ = lesson
    captured, plan, x = code.answer, code.Plan(3), torch.ones(2)
    copy = types.FunctionType(captured.__code__, captured.__globals__)  # made before

    def via_copy(y):
        return copy(y)

    ways = {"called answer": lambda: captured(x),
            "called answer ": lambda: (lambda y, _a=code.answer: _a(y))(x),  # default argument
            "called wrapped_answer": lambda: code.wrapped_answer(x),  # through __wrapped__
            "used Split": lambda: code.Split.apply(x),
            "used Plan": lambda: code.Plan(3),
            "called Plan.bubble": lambda: plan.bubble(5)}  # an instance made before
    with Answers(packages=("late_lesson",)).refusing() as refused:
        for says, way in ways.items():
            with pytest.raises(ForbiddenCall, match=says.strip()):
                way()
        assert "answer from late_lesson.sub.code" in refused.copies_in(via_copy)
        assert code._private(x) is x  # private: not an answer
    assert captured(x) is x and code.wrapped_answer(x) is x and plan.bubble(5) == 2 / 7
    assert torch.equal(code.Split.apply(x), x) and code.Plan(4).n == 4


def test_keep_classes_refuses_a_subclass_through_its_methods(lesson):
    code, _ = lesson

    class Mine(code.Split):  # made in the student's notebook, before the check
        pass

    with Answers(packages=("late_lesson",), keep_classes=True).refusing():
        assert code.Split is not None and isinstance(code.Split, type)  # the name is kept
        with pytest.raises(ForbiddenCall, match="Split"):
            Mine.apply(torch.ones(1))
    assert torch.equal(Mine.apply(torch.ones(1)), torch.ones(1))


def test_the_checks_functions_refuse_but_those_allowed(lesson):
    _, check = lesson
    with Answers(checks=("late_check",), allow=("helper",)).refusing():
        with pytest.raises(ForbiddenCall, match=f"called reference from late_check, which this "
                                                f"exercise does not allow: {WHY_KEY}"):
            check.reference(1)
        assert check.helper(1) == 1
    assert check.reference(1) == 1


def test_a_package_not_written_yet_refuses_only_torch():
    answers = Answers(packages=("dlcourse.parallel.not_written_yet",),
                      torch=(("torch.nn.parallel", "DistributedDataParallel"),))
    assert [name for name, _ in answers.objects()] == ["torch's DistributedDataParallel"]


entered = []


@contextlib.contextmanager
def _noted():
    entered.append("in")
    yield
    entered.append("out")


def test_other_guards_are_entered_with_the_refusals():
    entered.clear()
    with Answers(also=(_noted,)).in_process(test_other_guards_are_entered_with_the_refusals):
        assert entered == ["in"]
    assert entered == ["in", "out"]
