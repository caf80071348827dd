"""Lesson 04, exercise 4 (`exercises/04_tensor_parallel.ipynb`): `check_g`, Megatron's g as an
autograd Function (the all-reduce of the partial outputs forward, the identity backward), run on
2, 3 and 4 real ranks forward and backward against one process's nn.Linear (`layers.run_operator`).
"""

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_tensor, fail, fresh_cases
from dlcourse.checks.tensor.in_rank import g_in_rank
from dlcourse.checks.tensor.layers import TOL, TOLERANCE, close, run_operator, shards


G_HINT = ("forward all-reduces (a clone of) x over the group and returns the sum; backward "
          "returns the incoming gradient as it is, None for the group: every rank already holds "
          "the whole gradient of the sum")


IN_PLACE_HINT = ("dist.all_reduce writes its result into the tensor it is given; a layer may "
                 "still need its own partial output (or autograd may have saved it for "
                 "backward), so g must not overwrite it: all-reduce a copy and return that")


@fresh_cases
def check_g(g_function, timeout=CHECK_TIMEOUT_S, *, rng):
    """g_function: an autograd Function, `g_function.apply(x, group)`: the partial outputs of a
    row-parallel layer; forward their all-reduce, backward the identity."""
    __tracebackhide__ = True
    run_operator(g_function, "g", rng, timeout, split="in",  # g leaves a row layer
                 harness=g_in_rank, rank_shards=_g_shards, hint=G_HINT, expect=_expect_g,
                 what="the sum of the partial outputs forward, the gradient unchanged backward")


def _g_shards(x, linear, upstream, tp):
    """Rank r's (its slice of x's last dim, its columns of W, the upstream gradient): g's forward
    must sum the partial outputs, which no rank can compute alone."""
    xs, columns = shards(x, tp, -1), shards(linear.weight.detach(), tp, 1)
    return [(xs[r], columns[r], upstream) for r in range(tp)]


def _expect_g(y, grad, x, xr, linear, upstream, tp, rank, where, changed):
    __tracebackhide__ = True
    w_r = linear.weight.detach().chunk(tp, dim=1)[rank]
    partial = x.chunk(tp, dim=-1)[rank] @ w_r.T
    expected = (x @ linear.weight.detach().T)
    hint = G_HINT
    if close(y, partial):
        hint = "forward returned this rank's partial output: all-reduce the partial outputs"
    elif close(y, expected / tp):
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
    if close(grad, tp * want):
        hint = (f"the gradient came back {tp} times too large: g's backward must not "
                "all-reduce (torch.distributed.nn.functional.all_reduce does, in backward too); "
                "return the incoming gradient as it is")
    expect_tensor(grad, want, where=f"{where}, backward: W_r.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
