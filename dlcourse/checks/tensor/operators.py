"""Lesson 04's exercises 3 and 4: Megatron's f and g as autograd Functions, run on real ranks
forward and backward against one process's nn.Linear (the set's guide is `__init__.py`). What
each rank received is counted by the kernel, outside it, and bounded by torch's own all-reduce
of the same tensor (`core.received`), on 3 and 4 ranks with 8 KiB or more to all-reduce: an
all-gather and a sum in the all-reduce's place fail."""

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, Submitted, expect_callable, expect_tensor, fail,
                                  fresh_cases, random_tensor)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.tensor.cases import draw_tp_sizes, wide_seed
from dlcourse.checks.tensor.in_rank import (_is_function_class, _not_a_function_class, f_in_rank,
                                            g_in_rank)
from dlcourse.checks.tensor.linear import (TOL, TOLERANCE, _all_reduce_of, _close, _linear, _run,
                                           _shards, _where, _wide_rows)


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


@fresh_cases
def check_f(f_function, timeout=CHECK_TIMEOUT_S, *, rng):
    """f_function: an autograd Function, `f_function.apply(x, group)`: x on the way into a
    column-parallel layer; forward the identity, backward the all-reduce of the gradient."""
    __tracebackhide__ = True
    _check_function(f_function, "f", rng, timeout)


@fresh_cases
def check_g(g_function, timeout=CHECK_TIMEOUT_S, *, rng):
    """g_function: an autograd Function, `g_function.apply(x, group)`: the partial outputs of a
    row-parallel layer; forward their all-reduce, backward the identity."""
    __tracebackhide__ = True
    _check_function(g_function, "g", rng, timeout)


def _check_function(fn, name, rng, timeout):
    __tracebackhide__ = True
    expect_callable(fn, name)
    if not isinstance(fn, Submitted) and not _is_function_class(fn):  # a submission: on the rank
        fail(name, None, _not_a_function_class(fn))
    for tp in draw_tp_sizes(rng):
        split = "out" if name == "f" else "in"  # f enters a column layer, g leaves a row layer
        linear, x = _linear(rng, tp, bias=False, split=split)
        if tp > 2:  # the all-reduced tensor 8 KiB or more (x's gradient for f, the output for g)
            x = _wide_rows(x, linear.in_features if name == "f" else linear.out_features, rng)
        upstream = random_tensor(linear(x).shape, torch.float64, wide_seed(rng))
        where = _where(name, tp, linear, x)
        xr = x.clone().requires_grad_()
        (linear(xr) * upstream).sum().backward()  # one process: the whole layer's gradients
        harness, rank_args = ((f_in_rank, _f_shards(x, linear, upstream, tp)) if name == "f"
                              else (g_in_rank, _g_shards(x, linear, upstream, tp)))
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        got = _run(fn, name, where, F_HINT if name == "f" else G_HINT, harness, rank_args,
                   timeout, received)
        for rank, (y, grad, *changed) in enumerate(got):  # g's harness: did x change?
            (_expect_f if name == "f" else _expect_g)(y, grad, x, xr, linear, upstream, tp, rank,
                                                      where, *changed)
        reduced = x if name == "f" else linear(x)  # what the one all-reduce carries
        most = torch_received(_all_reduce_of, [(torch.zeros_like(reduced),)] * tp)
        expect_received_data(received, most, where, F_HINT if name == "f" else G_HINT)
    what = ("the identity forward, x's gradient summed over the ranks backward" if name == "f"
            else "the sum of the partial outputs forward, the gradient unchanged backward")
    print(f"{name}: passed on 3 cases drawn afresh (2, 3 and 4 ranks): {what}")


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
