"""Lesson 04's checks of Megatron's f and g (`dlcourse/checks/tensor/megatron_f.py`,
`megatron_g.py`): the
solutions and correct answers written other ways pass; the wrong answers students write fail
with a message naming the case, the rank and a hint that says which mistake it was. Every run
draws new cases, so each wrong answer here fails on whatever is drawn."""

import pytest
import torch
import torch.distributed as dist

import dlcourse.parallel.tensor.comm as tp_comm
from checking import first_line_and_hint
from dlcourse.checks.tensor import check_f, check_g
from tensor_checking import expect_failure


# --- exercises 3 and 4: f and g ---------------------------------------------------------------

class MegatronF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class FReturnsItsInput(torch.autograd.Function):  # Megatron's: the input itself, async reduce
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        summed = grad.clone()
        dist.all_reduce(summed, group=ctx.group, async_op=True).wait()
        return summed, None


class FNoBackwardReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class FReducesForward(torch.autograd.Function):  # f and g swapped
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class FAverages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad / dist.get_world_size(ctx.group), None


class FCallsTheLibrarysBackward(torch.autograd.Function):  # a bypass: the method by hand
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        from dlcourse.parallel.tensor.comm import CopyToTensorParallel
        return CopyToTensorParallel.backward(ctx, grad)


class FSubclassesTheLibrary(tp_comm.CopyToTensorParallel):  # a bypass: inherits apply
    pass


def not_a_function(x, group):
    return x


@pytest.mark.parametrize("answer", [MegatronF, FReturnsItsInput])
def test_f_passes_correct_answers(answer, capsys):
    check_f(answer)
    assert "f: passed on 3 cases drawn afresh" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (FNoBackwardReduce, "rank ? returned wrong values", "must all-reduce it"),
    (FReducesForward, "rank ? returned wrong values", "the all-reduce belongs in backward"),
    (FAverages, "rank ? returned wrong values", "averaged"),
    (FCallsTheLibrarysBackward, "rank ? called CopyToTensorParallel.backward from", ""),
    (FSubclassesTheLibrary, "rank ? used CopyToTensorParallel from", ""),
])
def test_f_fails_wrong_answers(answer, says, hint):
    expect_failure(check_f, answer, "f", says, hint)


def test_f_wants_the_class():
    first, _ = first_line_and_hint(check_f, not_a_function)
    assert "autograd Function class" in first


class MegatronG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GInPlace(torch.autograd.Function):  # Megatron's: the caller's tensor overwritten
    @staticmethod
    def forward(ctx, x, group):
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None


class GReducesBackwardToo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GAverages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x / dist.get_world_size(group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@pytest.mark.parametrize("answer", [MegatronG])
def test_g_passes_correct_answers(answer, capsys):
    check_g(answer)
    assert "g: passed on 3 cases drawn afresh" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (GReducesBackwardToo, "rank ? returned wrong values", "times too large"),
    (GNoReduce, "rank ? returned wrong values", "partial output"),
    (GAverages, "rank ? returned wrong values", "averaged"),
    (MegatronF, "rank ? returned wrong values", ""),  # f handed in for g
    (GInPlace, "rank ? changed the tensor it was given", "all-reduce a copy"),
])
def test_g_fails_wrong_answers(answer, says, hint):
    first, _ = expect_failure(check_g, answer, "g", says, hint)
    if answer is GReducesBackwardToo:
        assert "backward: W_r.grad" in first


def g_written_as_the_lesson_wrote_it():
    """The student's g, line for line the lesson's `ReduceFromTensorParallel`, its methods on the
    very lines the lesson's start on (Python's == on code objects compares first lines, not
    qualified names): compiled from the notebook's cell, in a class of the student's name."""
    import inspect
    lines, first = inspect.getsourcelines(tp_comm.ReduceFromTensorParallel)
    body = "".join(lines).replace("class ReduceFromTensorParallel", "class MyG")
    namespace = {"torch": torch, "dist": dist, "__name__": "__main__"}  # as a kernel runs it
    exec(compile("\n" * (first - 1) + body, "<notebook cell>", "exec"), namespace)
    return namespace["MyG"]


def test_g_written_as_the_lesson_wrote_it_passes(capsys):
    check_g(g_written_as_the_lesson_wrote_it())
    assert "g: passed on 3 cases drawn afresh" in capsys.readouterr().out
