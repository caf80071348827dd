"""Checks for lesson 04's exercises (`exercises/04_tensor_parallel.ipynb`): tensor parallelism by
hand.

    check_column_parallel_linear(column_parallel_linear)  W cut by rows, outputs all-gathered
    check_row_parallel_linear(row_parallel_linear)        W cut by columns, summed, bias once
    check_f(MegatronF)                                    identity forward, all-reduce backward
    check_g(MegatronG)                                    all-reduce forward, identity backward
    check_qkv_shard(qkv_shard)                            a rank's heads of the fused q, k, v
    check_vocab_parallel_cross_entropy(...)               the loss without gathering the logits

The last two are in `tensor_layers.py`. Every check runs the student's code on 2, 3 and 4 real
ranks (in a random order) with sizes, biases and values drawn afresh on each run from a seed that
a failure prints (`seed=` replays it), in float64, and compares every rank's output (and, for f
and g, every gradient) with one process running `nn.Linear` on the whole tensors. While the
student's code runs the lesson's `dlcourse.parallel.tensor` and torch's DTensor tensor
parallelism are refused (`tensor_library.py`).
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.checks.core import (CHECK_TIMEOUT_S, Submitted, expect_callable, expect_tensor,
                                  fail, kind, random_tensor, run_on_ranks)
from dlcourse.checks.tensor_layers import check_qkv_shard, check_vocab_parallel_cross_entropy
from dlcourse.checks.tensor_library import TENSOR, draw, draw_tp_sizes, wide_seed

__all__ = ["check_column_parallel_linear", "check_row_parallel_linear", "check_f", "check_g",
           "check_qkv_shard", "check_vocab_parallel_cross_entropy"]

# float64 rounding: an output element is a dot product of at most 16 terms of size ~1, which one
# process and a rank round differently by ~1e-15; 1e-10 allows 10^5 times that. Every mistake
# these checks name moves some element by 0.01 or more.
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"


def _close(a, b):
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, **TOL)


def _linear(rng, tp, bias, split):
    """A float64 nn.Linear whose `split` ("out" or "in") features are a multiple of tp, and an
    input x of 1 or 2 leading dims."""
    n_in = tp * rng.randint(1, 4) if split == "in" else rng.randint(1, 6)
    n_out = tp * rng.randint(1, 4) if split == "out" else rng.randint(1, 6)
    linear = nn.Linear(n_in, n_out, bias=bias, dtype=torch.float64)
    with torch.no_grad():  # a seed of its own each, from 2**62: x does not give W's away
        linear.weight.copy_(random_tensor(linear.weight.shape, torch.float64, wide_seed(rng)))
        if bias:
            linear.bias.copy_(random_tensor((n_out,), torch.float64, wide_seed(rng)))
    lead = rng.choice([(rng.randint(1, 5),), (rng.randint(1, 3), rng.randint(1, 4))])
    return linear, random_tensor((*lead, n_in), torch.float64, wide_seed(rng))


def _where(exercise, tp, linear, x, seed):
    bias = "with bias" if linear.bias is not None else "no bias"
    return (f"{exercise} on {tp} ranks, nn.Linear({linear.in_features}, {linear.out_features}, "
            f"{bias}), x of shape {tuple(x.shape)}, seed {seed}")


def _run(fn, exercise, where, hint, harness, rank_args, timeout):
    """The harness's value on every rank; rank r is sent `rank_args[r]`, its shard only."""
    return [value for value, _ in run_on_ranks(
        fn, rank_args, exercise=exercise, where=where, hint=hint, harness=harness,
        guard=TENSOR.in_rank, timeout=timeout)]


def _shards(tensor, tp, dim):
    """Rank r's piece of `tensor` (None stays None), cut into tp along `dim`, for r in order."""
    return [None] * tp if tensor is None else [t.clone() for t in tensor.chunk(tp, dim=dim)]


def _detached(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


# ---------------------------------------------------------------- exercise 1: column parallel

COLUMN_HINT = ("y_r = x @ weight.T + bias is this rank's out/t output features; all-gather the "
               "y_r of every rank (dist.all_gather into a list of t tensors shaped like y_r) and "
               "torch.cat them along the last dim, in rank order")


def check_column_parallel_linear(column_parallel_linear, seed=None, timeout=CHECK_TIMEOUT_S):
    """column_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight
    this rank's rows (out/t, in) of W, bias its (out/t,) of b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    expect_callable(column_parallel_linear, "column_parallel_linear")
    seed, rng = draw(seed)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        linear, x = _linear(rng, tp, bias=i != 1, split="out")
        where = _where("column_parallel_linear", tp, linear, x, seed)
        expected = linear(x).detach()
        rows, bias = _shards(linear.weight.detach(), tp, 0), _shards(_bias(linear), tp, 0)
        got = _run(column_parallel_linear, "column_parallel_linear", where, COLUMN_HINT,
                   _column_in_rank, [(x, rows[r], bias[r]) for r in range(tp)], timeout)
        for rank, y in enumerate(got):
            expect_tensor(y, expected, where=where, rank=rank, tolerance=TOLERANCE,
                          hint=_column_hint(y, expected, linear, x, tp), **TOL)
    print(f"column_parallel_linear: passed on 3 cases drawn with seed {seed} (2, 3 and 4 ranks; "
          "with and without bias; 1 and 2 leading dims), equal to nn.Linear on every rank")


def _column_in_rank(student, x, w_r, b_r):
    """Runs in every rank, which holds x (..., in), its rows of W (out/t, in) and its entries
    of b (out/t,) only: the student's output."""
    return _detached(student(x, w_r, b_r, dist.group.WORLD))


def _bias(linear):
    return None if linear.bias is None else linear.bias.detach()


def _column_hint(y, expected, linear, x, tp):
    """Which mistake gives `y`, if it is one we know."""
    blocks = expected.chunk(tp, dim=-1)  # what each rank computes: (..., out/t)
    if isinstance(y, torch.Tensor) and y.shape == blocks[0].shape != expected.shape:
        return "this is one rank's block of the output: all-gather the blocks of every rank"
    if _close(y, torch.cat(blocks, dim=0)) or _close(y, torch.stack(blocks)):
        return ("the blocks were joined along dim 0: each rank holds some output features "
                "(columns of y), so torch.cat them along the last dim")
    if _close(y, torch.cat(blocks[::-1], dim=-1)):
        return "the blocks are in the wrong order: rank r's block is the r-th, left to right"
    if linear.bias is not None and _close(y, expected - linear.bias.detach()):
        return "the bias is missing: add this rank's bias entries to its block before gathering"
    return COLUMN_HINT


# ---------------------------------------------------------------- exercise 2: row parallel

ROW_HINT = ("take this rank's slice of x's last dim (x.chunk(t, dim=-1)[rank]), multiply it by "
            "weight.T (a partial sum of the output), all-reduce the partial sums, then add the "
            "bias once")


def check_row_parallel_linear(row_parallel_linear, seed=None, timeout=CHECK_TIMEOUT_S):
    """row_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight this
    rank's columns (out, in/t) of W, bias the whole (out,) b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    expect_callable(row_parallel_linear, "row_parallel_linear")
    seed, rng = draw(seed)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        linear, x = _linear(rng, tp, bias=i != 2, split="in")
        where = _where("row_parallel_linear", tp, linear, x, seed)
        expected = linear(x).detach()
        columns = _shards(linear.weight.detach(), tp, 1)
        got = _run(row_parallel_linear, "row_parallel_linear", where, ROW_HINT, _row_in_rank,
                   [(x, columns[r], _bias(linear)) for r in range(tp)], timeout)
        for rank, y in enumerate(got):
            expect_tensor(y, expected, where=where, rank=rank, tolerance=TOLERANCE,
                          hint=_row_hint(y, expected, linear, x, tp, rank), **TOL)
    print(f"row_parallel_linear: passed on 3 cases drawn with seed {seed} (2, 3 and 4 ranks; "
          "with and without bias), equal to nn.Linear on every rank, the bias added once")


def _row_in_rank(student, x, w_r, b):
    """Runs in every rank, which holds x (..., in), its columns of W (out, in/t) and the whole
    bias (out,) only: the student's output."""
    return _detached(student(x, w_r, b, dist.group.WORLD))


def _row_hint(y, expected, linear, x, tp, rank):
    bias = 0 if linear.bias is None else linear.bias.detach()
    w_r = linear.weight.detach().chunk(tp, dim=1)[rank]
    partial = x.chunk(tp, dim=-1)[rank] @ w_r.T  # (..., out): this rank's term
    if linear.bias is not None and _close(y, expected + (tp - 1) * bias):
        return (f"the bias was added {tp} times, once on every rank before the all-reduce: add "
                "it after the all-reduce (or on one rank only, before it)")
    if linear.bias is not None and _close(y, expected - bias):
        return "the bias is missing: add it once, after the all-reduce"
    if _close(y, partial + bias):
        return ("this is only this rank's partial sum: all-reduce the partial sums of the "
                "ranks (dist.all_reduce) before adding the bias")
    return ROW_HINT


# ---------------------------------------------------------------- exercises 3 and 4: f and g

F_HINT = ("forward returns x unchanged (x.view_as(x)) and keeps the group in ctx; backward "
          "all-reduces the incoming gradient over ctx.group (every rank's layer used x, so x's "
          "gradient is the sum of the ranks' gradients) and returns it, None for the group")
G_HINT = ("forward all-reduces (a clone of) x over the group and returns the sum; backward "
          "returns the incoming gradient as it is, None for the group: every rank already holds "
          "the whole gradient of the sum")


IN_PLACE_HINT = ("dist.all_reduce writes its result into the tensor it is given; a layer may "
                 "still need its own partial output (or autograd may have saved it for "
                 "backward), so g must not overwrite it: all-reduce a copy and return that")


def check_f(f_function, seed=None, timeout=CHECK_TIMEOUT_S):
    """f_function: an autograd Function, `f_function.apply(x, group)`: x on the way into a
    column-parallel layer; forward the identity, backward the all-reduce of the gradient."""
    __tracebackhide__ = True
    _check_function(f_function, "f", seed, timeout)


def check_g(g_function, seed=None, timeout=CHECK_TIMEOUT_S):
    """g_function: an autograd Function, `g_function.apply(x, group)`: the partial outputs of a
    row-parallel layer; forward their all-reduce, backward the identity."""
    __tracebackhide__ = True
    _check_function(g_function, "g", seed, timeout)


def _check_function(fn, name, seed, timeout):
    __tracebackhide__ = True
    expect_callable(fn, name)
    if not isinstance(fn, Submitted) and not _is_function_class(fn):  # a submission: on the rank
        fail(name, None, _not_a_function_class(fn))
    seed, rng = draw(seed)
    for tp in draw_tp_sizes(rng):
        split = "out" if name == "f" else "in"  # f enters a column layer, g leaves a row layer
        linear, x = _linear(rng, tp, bias=False, split=split)
        upstream = random_tensor(linear(x).shape, torch.float64, wide_seed(rng))
        where = _where(name, tp, linear, x, seed)
        xr = x.clone().requires_grad_()
        (linear(xr) * upstream).sum().backward()  # one process: the whole layer's gradients
        harness, rank_args = ((_f_in_rank, _f_shards(x, linear, upstream, tp)) if name == "f"
                              else (_g_in_rank, _g_shards(x, linear, upstream, tp)))
        got = _run(fn, name, where, F_HINT if name == "f" else G_HINT, harness, rank_args,
                   timeout)
        for rank, (y, grad, *changed) in enumerate(got):  # g's harness: did x change?
            (_expect_f if name == "f" else _expect_g)(y, grad, x, xr, linear, upstream, tp, rank,
                                                      where, *changed)
    what = ("the identity forward, x's gradient summed over the ranks backward" if name == "f"
            else "the sum of the partial outputs forward, the gradient unchanged backward")
    print(f"{name}: passed on 3 cases drawn with seed {seed} (2, 3 and 4 ranks): {what}")


def _is_function_class(fn):
    return isinstance(fn, type) and issubclass(fn, torch.autograd.Function)


def _not_a_function_class(fn):
    return (f"the check needs your autograd Function class itself (class ...("
            f"torch.autograd.Function) with forward and backward), not {kind(fn)}")


def _apply(student, x):
    """student.fn.apply(x, WORLD), inside the guards, once it is known to be a Function class
    (for a submission, only the rank has it unpickled)."""
    if not _is_function_class(student.fn):
        raise TypeError(_not_a_function_class(student.fn))
    return student.fn.apply(x, dist.group.WORLD)


def _f_shards(x, linear, upstream, tp):
    """Rank r's (x, its rows of W, its block of the upstream gradient): f's backward must sum
    x's gradient shares, which no rank can compute alone."""
    rows, ups = _shards(linear.weight.detach(), tp, 0), _shards(upstream, tp, -1)
    return [(x, rows[r], ups[r]) for r in range(tp)]


def _g_shards(x, linear, upstream, tp):
    """Rank r's (its slice of x's last dim, its columns of W, the upstream gradient): g's forward
    must sum the partial outputs, which no rank can compute alone."""
    xs, columns = _shards(x, tp, -1), _shards(linear.weight.detach(), tp, 1)
    return [(xs[r], columns[r], upstream) for r in range(tp)]


def _f_in_rank(student, x, w_r, up_r):
    """Runs in every rank: y = f(x) feeds this rank's rows of W, w_r (out/t, in), a
    column-parallel layer; the gradient of its output block, up_r (..., out/t), flows back
    through the student's backward."""
    x = x.requires_grad_()
    with student.guarded():  # forward and backward both run the student's code
        y = _apply(student, x)
        if isinstance(y, torch.Tensor) and y.shape == x.shape and y.requires_grad:
            (y @ w_r.T * up_r).sum().backward()
    return _detached(y), _detached(x.grad)


def _g_in_rank(student, x_r, w_r, upstream):
    """Runs in every rank: this rank's partial output x_r W_r^T (x_r (..., in/t), W_r (out,
    in/t)) goes through g; every rank then has the same loss, whose gradient must reach W_r
    unchanged."""
    w_r = w_r.requires_grad_()
    partial = x_r @ w_r.T  # (..., out)
    before = partial.detach().clone()  # g must leave the caller's tensor as it was
    with student.guarded():
        y = _apply(student, partial)
        changed = not torch.equal(partial.detach(), before)
        if isinstance(y, torch.Tensor) and y.shape == partial.shape and y.requires_grad:
            (y * upstream).sum().backward()
    return _detached(y), _detached(w_r.grad), changed


def _expect_f(y, grad, x, xr, linear, upstream, tp, rank, where):
    __tracebackhide__ = True
    hint = (f"f's forward is the identity: the all-reduce belongs in backward. {F_HINT}"
            if _close(y, tp * x) else F_HINT)
    expect_tensor(y, x, where=f"{where}, forward", rank=rank, hint=hint)
    if grad is None:
        fail(f"{where}, backward", rank, "left x.grad None: backward must return the gradient "
             "for x (and None for the group)", F_HINT)
    w_r, up_r = linear.weight.detach().chunk(tp, dim=0)[rank], upstream.chunk(tp, dim=-1)[rank]
    hint = F_HINT
    if _close(grad, up_r @ w_r):
        hint = ("x's gradient is only this rank's share (from its own rows of W): backward "
                "must all-reduce it over the group")
    elif _close(grad, xr.grad / tp):
        hint = "x's gradient was averaged: sum it over the ranks, do not divide by t"
    expect_tensor(grad, xr.grad, where=f"{where}, backward: x.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)


def _expect_g(y, grad, x, xr, linear, upstream, tp, rank, where, changed):
    __tracebackhide__ = True
    w_r = linear.weight.detach().chunk(tp, dim=1)[rank]
    partial = x.chunk(tp, dim=-1)[rank] @ w_r.T
    expected = (x @ linear.weight.detach().T)
    hint = G_HINT
    if _close(y, partial):
        hint = "forward returned this rank's partial output: all-reduce the partial outputs"
    elif _close(y, expected / tp):
        hint = "forward averaged the partial outputs: they must be summed (no division by t)"
    expect_tensor(y, expected, where=f"{where}, forward", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
    if changed:
        fail(f"{where}, forward", rank, "changed the tensor it was given: the caller's partial "
             "output now holds the sum of every rank's", IN_PLACE_HINT)
    if grad is None:
        fail(f"{where}, backward", rank, "left the gradient of W_r None: backward must return "
             "the gradient for x (and None for the group)", G_HINT)
    want = linear.weight.grad.chunk(tp, dim=1)[rank]  # W_r's columns of the whole gradient
    hint = G_HINT
    if _close(grad, tp * want):
        hint = (f"the gradient came back {tp} times too large: g's backward must not "
                "all-reduce (torch.distributed.nn.functional.all_reduce does, in backward too); "
                "return the incoming gradient as it is")
    expect_tensor(grad, want, where=f"{where}, backward: W_r.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
