"""What a check compares and how it words a mismatch: `CheckFailed`, the `expect_*` helpers
and `fail`, and how messages name a tensor (`describe`, `kind`). Re-exported by
`core/__init__.py`, where the rest of the checks' API lives."""

import torch

from dlcourse.tracebacks import student_traceback


class CheckFailed(AssertionError):
    """A student's function gave a wrong answer; the message says where and what to try."""

    def _render_traceback_(self):
        """How IPython shows it: the student's cell and the message, none of the checks' frames."""
        return student_traceback(self)


def expect_callable(fn, exercise):
    """Fail unless the grader cell was given the student's function itself."""
    __tracebackhide__ = True
    if not callable(fn):
        raise CheckFailed(f"the check for {exercise} needs your function itself (its name, "
                          f"without parentheses), not {kind(fn)}")


def fail(where, rank, problem, hint=""):
    """Raise CheckFailed: '<where>: rank <rank> <problem>' and a hint on the next line."""
    __tracebackhide__ = True
    message = f"{where}: rank {rank} {problem}" if rank is not None else f"{where}: {problem}"
    raise CheckFailed(message + (f"\nHint: {hint}" if hint else ""))


def expect_tensor(got, expected, *, where, rank, atol=0.0, rtol=0.0, tolerance="", hint=""):
    """Fail unless `got` is a tensor of `expected`'s shape and dtype with the same values."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        fail(where, rank, f"returned {kind(got)}, expected {describe(expected)}", hint)
    if got.shape != expected.shape:
        fail(where, rank, f"returned shape {tuple(got.shape)}, expected {tuple(expected.shape)}",
             hint)
    if got.dtype != expected.dtype:
        fail(where, rank, f"returned dtype {dtype_name(got.dtype)}, expected {dtype_name(expected.dtype)}",
             hint)
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if atol or rtol:
        wrong = ~torch.isclose(got, expected, rtol=rtol, atol=atol)
    else:
        wrong = got != expected
    if wrong.any():
        first = tuple(wrong.nonzero()[0].tolist())
        at = f"element {list(first)}" if first else "the value"
        problem = (f"returned wrong values: {at} is {got[first].item()!r}, expected "
                   f"{expected[first].item()!r} ({int(wrong.sum())} of {wrong.numel()} differ)")
        if tolerance:
            problem += f"; allowed difference {tolerance}"
        fail(where, rank, problem, hint)


def expect_none(got, *, where, rank, hint=""):
    __tracebackhide__ = True
    if got is not None:
        fail(where, rank, f"returned {kind(got)}, expected None", hint)


def expect_unchanged(before, after, *, where, rank, name="its input", hint=""):
    """Fail if a function changed the caller's tensor in place (collectives work in place)."""
    __tracebackhide__ = True
    if not torch.equal(before, after):
        fail(where, rank, f"changed {name} in place: the caller's tensor must keep its values",
             hint)


def random_tensor(shape, dtype, seed):
    """A reproducible tensor of small values: integers for integer dtypes, else normal floats."""
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return torch.randint(-99, 100, shape, generator=generator, dtype=dtype)


def describe(value):
    """'int64 tensor of shape (2, 5)': how messages name a tensor."""
    return f"{dtype_name(value.dtype)} tensor of shape {tuple(value.shape)}"


def kind(value):
    """'None', 'float32 tensor of shape (3,)' or 'a list': how messages name what came back."""
    if value is None:
        return "None"
    return describe(value) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"


def as_tensor(value, dtype=None):
    """What a student returned, as a tensor (`torch.as_tensor`: a list, or a tensor in `dtype`),
    or None when it is none, for the check to say what it got instead."""
    try:
        return torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError):
        return None


def dtype_name(dtype):
    """'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")
