"""Lesson 04, exercise 3 (`exercises/04_tensor_parallel.ipynb`): `check_f`, Megatron's f as an
autograd Function (the identity forward, the all-reduce of x's gradient backward), run on 2, 3
and 4 real ranks forward and backward against one process's nn.Linear (`layers.run_operator`).
"""

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_tensor, fail, fresh_cases
from dlcourse.checks.tensor.in_rank import f_in_rank
from dlcourse.checks.tensor.layers import TOL, TOLERANCE, close, run_operator, shards


F_HINT = ("forward returns x unchanged (x.view_as(x)) and keeps the group in ctx; backward "
          "all-reduces the incoming gradient over ctx.group (every rank's layer used x, so x's "
          "gradient is the sum of the ranks' gradients) and returns it, None for the group")


@fresh_cases
def check_f(f_function, timeout=CHECK_TIMEOUT_S, *, rng):
    """f_function: an autograd Function, `f_function.apply(x, group)`: x on the way into a
    column-parallel layer; forward the identity, backward the all-reduce of the gradient."""
    __tracebackhide__ = True
    run_operator(f_function, "f", rng, timeout, split="out",  # f enters a column layer
                 harness=f_in_rank, rank_shards=_f_shards, hint=F_HINT, expect=_expect_f,
                 what="the identity forward, x's gradient summed over the ranks backward")


def _f_shards(x, linear, upstream, tp):
    """Rank r's (x, its rows of W, its block of the upstream gradient): f's backward must sum
    x's gradient shares, which no rank can compute alone."""
    rows, ups = shards(linear.weight.detach(), tp, 0), shards(upstream, tp, -1)
    return [(x, rows[r], ups[r]) for r in range(tp)]


def _expect_f(y, grad, x, xr, linear, upstream, tp, rank, where):
    __tracebackhide__ = True
    hint = (f"f's forward is the identity: the all-reduce belongs in backward. {F_HINT}"
            if close(y, tp * x) else F_HINT)
    expect_tensor(y, x, where=f"{where}, forward", rank=rank, hint=hint)
    if grad is None:
        fail(f"{where}, backward", rank, "left x.grad None: backward must return the gradient "
             "for x (and None for the group)", F_HINT)
    w_r, up_r = linear.weight.detach().chunk(tp, dim=0)[rank], upstream.chunk(tp, dim=-1)[rank]
    hint = F_HINT
    if close(grad, up_r @ w_r):
        hint = ("x's gradient is only this rank's share (from its own rows of W): backward "
                "must all-reduce it over the group")
    elif close(grad, xr.grad / tp):
        hint = "x's gradient was averaged: sum it over the ranks, do not divide by t"
    expect_tensor(grad, xr.grad, where=f"{where}, backward: x.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
