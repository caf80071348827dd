"""The float64 layer lesson 04's linear, f and g checks draw, run on real ranks and compare with
one process's `nn.Linear` (`column_parallel_linear.py`, `row_parallel_linear.py`, `megatron_f.py`,
`megatron_g.py`), and the tolerance every lesson-04 check compares with.
"""

import torch
import torch.nn as nn

from dlcourse.checks.core import (Submitted, expect_callable, expect_tensor, fail, random_tensor,
                                  run_on_ranks)
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import draw_tp_sizes, wide_seed
from dlcourse.checks.tensor.in_rank import _is_function_class, _not_a_function_class


# float64 rounding: an output element is a dot product of at most 16 terms of size ~1, which one
# process and a rank round differently by ~1e-15; 1e-10 allows 10^5 times that. Every mistake
# these checks name moves some element by 0.01 or more.
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"


def close(a, b):
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, **TOL)


def draw_linear(rng, tp, bias, split):
    """A float64 nn.Linear whose `split` ("out" or "in") features are 2 to 4 times tp (at one a
    rank, cutting into 4 pieces cuts as into tp for tp < 4: an answer right for tp = 4 alone
    would pass), and an input x of 1 or 2 leading dims."""
    n_in = tp * rng.randint(2, 4) if split == "in" else rng.randint(1, 6)
    n_out = tp * rng.randint(2, 4) if split == "out" else rng.randint(1, 6)
    linear = nn.Linear(n_in, n_out, bias=bias, dtype=torch.float64)
    with torch.no_grad():  # a seed of its own each, from 2**62: x does not give W's away
        linear.weight.copy_(random_tensor(linear.weight.shape, torch.float64, wide_seed(rng)))
        if bias:
            linear.bias.copy_(random_tensor((n_out,), torch.float64, wide_seed(rng)))
    lead = rng.choice([(rng.randint(1, 5),), (rng.randint(1, 3), rng.randint(1, 4))])
    return linear, random_tensor((*lead, n_in), torch.float64, wide_seed(rng))


def describe_case(exercise, tp, linear, x):
    bias = "with bias" if linear.bias is not None else "no bias"
    return (f"{exercise} on {tp} ranks, nn.Linear({linear.in_features}, {linear.out_features}, "
            f"{bias}), x of shape {tuple(x.shape)}")


def run_layer(fn, exercise, where, hint, harness, rank_args, timeout):
    """The harness's value on every rank; rank r is sent `rank_args[r]`, its shard only."""
    return [value for value, _ in run_on_ranks(
        fn, rank_args, exercise=exercise, where=where, hint=hint, harness=harness,
        guard=ANSWERS.in_rank, timeout=timeout)]


def shards(tensor, tp, dim):
    """Rank r's piece of `tensor` (None stays None), cut into tp along `dim`, for r in order."""
    return [None] * tp if tensor is None else [t.clone() for t in tensor.chunk(tp, dim=dim)]


def capital(text):
    return text[:1].upper() + text[1:]


def run_linear(fn, exercise, rng, timeout, split, no_bias, pieces, harness, hint, mistake):
    """The column and row checks: a layer drawn on each of 2, 3 and 4 ranks (cut along its
    `split` features; the `no_bias`-th without a bias), rank r sent `pieces(linear, x, tp)[r]`
    only, and every rank's output equal to the whole layer's; `mistake` names the one a wrong
    output shows."""
    __tracebackhide__ = True
    expect_callable(fn, exercise)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        linear, x = draw_linear(rng, tp, bias=i != no_bias, split=split)
        where = describe_case(exercise, tp, linear, x)
        expected = linear(x).detach()
        got = run_layer(fn, exercise, where, hint, harness, pieces(linear, x, tp), timeout)
        for rank, y in enumerate(got):
            expect_tensor(y, expected, where=where, rank=rank, tolerance=TOLERANCE,
                          hint=mistake(y, expected, linear, x, tp, rank), **TOL)


def bias_of(linear):
    return None if linear.bias is None else linear.bias.detach()


def run_operator(fn, name, rng, timeout, *, split, harness, rank_shards, hint, expect, what):
    """f's and g's checks: a layer without bias drawn on each of 2, 3 and 4 ranks (cut along its
    `split` features), its gradients from one process's backward of (layer(x) * upstream).sum(),
    rank r sent `rank_shards(x, linear, upstream, tp)[r]` only, and every rank's (output,
    gradient, ...) held to `expect`."""
    __tracebackhide__ = True
    expect_callable(fn, name)
    if not isinstance(fn, Submitted) and not _is_function_class(fn):  # a submission: on the rank
        fail(name, None, _not_a_function_class(fn))
    for tp in draw_tp_sizes(rng):
        linear, x = draw_linear(rng, tp, bias=False, split=split)
        upstream = random_tensor(linear(x).shape, torch.float64, wide_seed(rng))
        where = describe_case(name, tp, linear, x)
        xr = x.clone().requires_grad_()
        (linear(xr) * upstream).sum().backward()  # one process: the whole layer's gradients
        got = run_layer(fn, name, where, hint, harness, rank_shards(x, linear, upstream, tp),
                        timeout)
        for rank, (y, grad, *changed) in enumerate(got):  # g's harness: did x change?
            expect(y, grad, x, xr, linear, upstream, tp, rank, where, *changed)
    print(f"{name}: passed on 3 cases drawn afresh (2, 3 and 4 ranks): {what}")
