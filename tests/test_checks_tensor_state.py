"""Issue 28, lesson 04: a student's function that reads the check's state instead of doing the
distributed work fails. It walks up the Python stack (`sys._getframe`) and through every object
the rank holds (`gc.get_objects`) for the whole weight, input, upstream gradient or logits, and
computes the answer from them without communicating. Each rank is sent its own shard only
(`launcher.PerRank`) and the reference is computed in the checking process, so there is nothing
whole to find: such a function finds its own shard, returns one rank's share (or raises), and
fails. The correct answers of tests/test_checks_megatron_f_g.py still pass."""

import gc
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from dlcourse.checks.core import CheckFailed
from dlcourse.checks.tensor import (check_column_parallel_linear, check_f, check_g,
                                    check_row_parallel_linear, check_vocab_parallel_cross_entropy)


def reachable_tensors():
    """Every tensor a rank's code can reach: the locals of each frame up the stack (and the
    tuples, lists and dicts they hold), and every tensor the garbage collector tracks."""
    found, frame = [], sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            found += _tensors_in(value)
        frame = frame.f_back
    with warnings.catch_warnings():  # isinstance on a deprecated torch object warns
        warnings.simplefilter("ignore")
        found += [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return [t.detach() for t in found]


def _tensors_in(value, depth=3):
    if isinstance(value, torch.Tensor):
        return [value]
    if depth and isinstance(value, (list, tuple, dict)):
        items = value.values() if isinstance(value, dict) else value
        return [t for item in items for t in _tensors_in(item, depth - 1)]
    return []


def holds(whole, part, dim):
    """True where `whole` is larger than `part` along `dim` and one of its blocks is `part`."""
    k = part.shape[dim]
    if whole.dim() != part.dim() or whole.shape[dim] <= k or whole.dtype != part.dtype:
        return False
    others = [d for d in range(part.dim()) if d != dim % part.dim()]
    if any(whole.shape[d] != part.shape[d] for d in others):
        return False
    return any(torch.equal(whole.narrow(dim, o, k), part)
               for o in range(0, whole.shape[dim] - k + 1, k))


def the_whole(part, dim):
    """A reachable tensor of which `part` is a block along `dim`, else `part` itself."""
    return next((t for t in reachable_tensors() if holds(t, part, dim)), part)


def column_from_the_stack(x, weight, bias, group):  # the whole W and b, if a rank holds them
    return F.linear(x, the_whole(weight, 0), None if bias is None else the_whole(bias, 0))


def row_from_the_stack(x, weight, bias, group):  # every column of W
    return F.linear(x, the_whole(weight, 1), bias)


def _pairs(share):
    """(a, b) of reachable tensors whose product `a[..., blk] @ b[blk]` over one block of their
    inner dim is `share`, the inner dim being larger than the block: the whole two factors."""
    seen = [t for t in reachable_tensors() if t.dtype == share.dtype]
    for b in (t for t in seen if t.dim() == 2 and t.shape[1] == share.shape[-1]):
        for a in (t for t in seen if t.shape[:-1] == share.shape[:-1]
                  and t.shape[-1] == b.shape[0]):
            for k in range(1, b.shape[0]):
                if b.shape[0] % k == 0 and any(
                        torch.allclose(a[..., o:o + k] @ b[o:o + k], share)
                        for o in range(0, b.shape[0], k)):
                    return a, b
    return None


class FFromTheStack(torch.autograd.Function):  # backward: the whole upstream times the whole W
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # grad: this rank's share, up_r @ w_r
        found = _pairs(grad)
        return (grad if found is None else found[0] @ found[1]), None


class GFromTheStack(torch.autograd.Function):  # forward: the whole x times the whole W
    @staticmethod
    def forward(ctx, partial, group):  # partial: x_r @ w_r.T, i.e. x_r @ (w_r.T)
        seen = [t for t in reachable_tensors() if t.dtype == partial.dtype]
        for w in (t for t in seen if t.dim() == 2 and t.shape[0] == partial.shape[-1]):
            for x in (t for t in seen if t.shape[:-1] == partial.shape[:-1]
                      and t.shape[-1] == w.shape[1]):
                if _whole_product(x, w, partial):
                    return x @ w.T
        return partial.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _whole_product(x, w, partial):
    n = w.shape[1]
    return any(torch.allclose(x[..., o:o + k] @ w[:, o:o + k].T, partial)
               for k in range(1, n) if n % k == 0 for o in range(0, n, k))


def loss_from_the_stack(logits, targets, group):  # the whole logits, this rank's put in place
    whole, v = the_whole(logits.detach(), 1), logits.shape[1]
    at = next(o for o in range(0, whole.shape[1], v)
              if torch.equal(whole[:, o:o + v], logits.detach()))
    return F.cross_entropy(torch.cat([whole[:, :at], logits, whole[:, at + v:]], dim=1), targets)


@pytest.mark.parametrize("check, answer", [
    (check_column_parallel_linear, column_from_the_stack),
    (check_row_parallel_linear, row_from_the_stack),
    (check_f, FFromTheStack),
    (check_g, GFromTheStack),
    (check_vocab_parallel_cross_entropy, loss_from_the_stack),
], ids=["column", "row", "f backward", "g forward", "vocabulary-parallel loss"])
def test_an_answer_that_reads_the_checks_whole_tensors_fails(check, answer):
    with pytest.raises(CheckFailed) as failed:
        check(answer)
    first = str(failed.value).splitlines()[0]
    assert "on 2 ranks" in first or "on 3 ranks" in first or "on 4 ranks" in first, first
