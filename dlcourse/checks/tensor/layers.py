"""The float64 layer lesson 04's linear, f and g checks draw, run on real ranks and compare with
one process's `nn.Linear` (`column_parallel_linear.py`, `row_parallel_linear.py`, `megatron_f.py`,
`megatron_g.py`), and the tolerance every lesson-04 check compares with. What each rank
received is counted by the kernel, outside it, and bounded by torch's own all-gather (column),
all-reduce (row, f, g) of the same tensors (`core.received`), on 3 and 4 ranks with 8 KiB or
more to move: an all-reduce of zero-padded blocks where an all-gather belongs fails, and so do an
all-gather and a sum in an all-reduce's place.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.checks.core import (Submitted, expect_callable, expect_tensor, fail, random_tensor,
                                  run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received, wire_floor_units
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


def wide_rows(x, width, rng):
    """x with rows enough that a (rows, width) float64 tensor is 4 WIRE_FLOOR bytes or more: on
    3 and 4 ranks an all-gather in the all-reduce's place then receives clear of the ceiling
    (gloo's all-reduce of tiny tensors is mostly headers, more than an all-gather's)."""
    rows = 4 * wire_floor_units(8 * width)
    return random_tensor((rows, x.shape[-1]), torch.float64, wide_seed(rng))


def all_reduce_of(tensor, way):
    """torch's own all-reduce of a tensor shaped like the one f, g or a row layer all-reduces."""
    dist.all_reduce(tensor)


def all_gather_of(block, way):
    """torch's own all-gather of a block shaped like each rank's output block."""
    t = dist.get_world_size()
    if way == "list":
        dist.all_gather([torch.empty_like(block) for _ in range(t)], block)
    else:
        dist.all_gather_into_tensor(block.new_empty(t * block.numel()), block.reshape(-1))


def describe_case(exercise, tp, linear, x):
    bias = "with bias" if linear.bias is not None else "no bias"
    return (f"{exercise} on {tp} ranks, nn.Linear({linear.in_features}, {linear.out_features}, "
            f"{bias}), x of shape {tuple(x.shape)}")


def run_layer(fn, exercise, where, hint, harness, rank_args, timeout, received=None):
    """The harness's value on every rank; rank r is sent `rank_args[r]`, its shard only;
    `received` (a dict), if given, filled with the bytes each rank received (`run_on_ranks`)."""
    return [value for value, _ in run_on_ranks(
        fn, rank_args, exercise=exercise, where=where, hint=hint, harness=harness,
        guard=ANSWERS.in_rank, timeout=timeout, received=received)]


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
        # what the layer's one collective carries: each rank's block (column), the whole
        # output's partial sums (row); on 3 and 4 ranks 8 KiB or more, clear of the headers
        width = linear.out_features // tp if split == "out" else linear.out_features
        x = wide_rows(x, width, rng) if tp > 2 else x
        where = describe_case(exercise, tp, linear, x)
        expected = linear(x).detach()
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        got = run_layer(fn, exercise, where, hint, harness, pieces(linear, x, tp), timeout,
                        received)
        for rank, y in enumerate(got):
            expect_tensor(y, expected, where=where, rank=rank, tolerance=TOLERANCE,
                          hint=mistake(y, expected, linear, x, tp, rank), **TOL)
        carried = torch.zeros(*x.shape[:-1], width, dtype=torch.float64)
        most = (torch_received(all_gather_of, [(carried,)] * tp, ways=("list", "tensor"))
                if split == "out" else torch_received(all_reduce_of, [(carried,)] * tp))
        expect_received_data(received, most, where, hint)


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
        f = split == "out"  # f enters a column layer, g leaves a row layer
        if tp > 2:  # the all-reduced tensor 8 KiB or more (x's gradient for f, the output for g)
            x = wide_rows(x, linear.in_features if f else linear.out_features, rng)
        upstream = random_tensor(linear(x).shape, torch.float64, wide_seed(rng))
        where = describe_case(name, tp, linear, x)
        xr = x.clone().requires_grad_()
        (linear(xr) * upstream).sum().backward()  # one process: the whole layer's gradients
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        got = run_layer(fn, name, where, hint, harness, rank_shards(x, linear, upstream, tp),
                        timeout, received)
        for rank, (y, grad, *changed) in enumerate(got):  # g's harness: did x change?
            expect(y, grad, x, xr, linear, upstream, tp, rank, where, *changed)
        reduced = x if f else linear(x)  # what the one all-reduce carries
        most = torch_received(all_reduce_of, [(torch.zeros_like(reduced),)] * tp)
        expect_received_data(received, most, where, hint)
    print(f"{name}: passed on 3 cases drawn afresh (2, 3 and 4 ranks): {what}")
