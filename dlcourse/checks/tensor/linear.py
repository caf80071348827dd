"""Lesson 04's column- and row-parallel linear checks, and what lesson 04's checks share
(the set's guide is `__init__.py`). What each rank received is counted by the kernel, outside
it, and bounded by torch's own all-gather (column) or all-reduce (row) of the same tensors
(`core.received`), on 3 and 4 ranks with 8 KiB or more to move: an all-reduce of zero-padded
blocks where an all-gather belongs fails."""

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, expect_tensor, fresh_cases,
                                  random_tensor, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received, wire_floor_units
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import draw_tp_sizes, wide_seed
from dlcourse.checks.tensor.in_rank import column_in_rank, row_in_rank


# float64 rounding: an output element is a dot product of at most 16 terms of size ~1, which one
# process and a rank round differently by ~1e-15; 1e-10 allows 10^5 times that. Every mistake
# these checks name moves some element by 0.01 or more.
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"


def _close(a, b):
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, **TOL)


def _linear(rng, tp, bias, split):
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


def _wide_rows(x, width, rng):
    """x with rows enough that a (rows, width) float64 tensor is 4 WIRE_FLOOR bytes or more: on
    3 and 4 ranks an all-gather in the all-reduce's place then receives clear of the ceiling
    (gloo's all-reduce of tiny tensors is mostly headers, more than an all-gather's)."""
    rows = 4 * wire_floor_units(8 * width)
    return random_tensor((rows, x.shape[-1]), torch.float64, wide_seed(rng))


def _all_reduce_of(tensor, way):
    """torch's own all-reduce of a tensor shaped like the one f or g all-reduces."""
    dist.all_reduce(tensor)


def _all_gather_of(block, way):
    """torch's own all-gather of a block shaped like each rank's output block."""
    t = dist.get_world_size()
    if way == "list":
        dist.all_gather([torch.empty_like(block) for _ in range(t)], block)
    else:
        dist.all_gather_into_tensor(block.new_empty(t * block.numel()), block.reshape(-1))


def _where(exercise, tp, linear, x):
    bias = "with bias" if linear.bias is not None else "no bias"
    return (f"{exercise} on {tp} ranks, nn.Linear({linear.in_features}, {linear.out_features}, "
            f"{bias}), x of shape {tuple(x.shape)}")


def _run(fn, exercise, where, hint, harness, rank_args, timeout, received=None):
    """The harness's value on every rank; rank r is sent `rank_args[r]`, its shard only;
    `received` (a dict), if given, filled with the bytes each rank received (`run_on_ranks`)."""
    return [value for value, _ in run_on_ranks(
        fn, rank_args, exercise=exercise, where=where, hint=hint, harness=harness,
        guard=ANSWERS.in_rank, timeout=timeout, received=received)]


def _shards(tensor, tp, dim):
    """Rank r's piece of `tensor` (None stays None), cut into tp along `dim`, for r in order."""
    return [None] * tp if tensor is None else [t.clone() for t in tensor.chunk(tp, dim=dim)]


def _capital(text):
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------- exercise 1: column parallel

COLUMN_HINT = ("y_r = x @ weight.T + bias is this rank's out/t output features; all-gather the "
               "y_r of every rank (dist.all_gather into a list of t tensors shaped like y_r) and "
               "torch.cat them along the last dim, in rank order")


@fresh_cases
def check_column_parallel_linear(column_parallel_linear, timeout=CHECK_TIMEOUT_S, *, rng):
    """column_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight
    this rank's rows (out/t, in) of W, bias its (out/t,) of b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    _check_linear(column_parallel_linear, "column_parallel_linear", rng, timeout, split="out",
                  no_bias=1, pieces=_column_pieces, harness=column_in_rank, hint=COLUMN_HINT,
                  mistake=_column_hint)
    print("column_parallel_linear: passed on 3 cases drawn afresh (2, 3 and 4 ranks; "
          "with and without bias; 1 and 2 leading dims), equal to nn.Linear on every rank")


def _check_linear(fn, exercise, rng, timeout, split, no_bias, pieces, harness, hint, mistake):
    """Both checks: a layer drawn on each of 2, 3 and 4 ranks (cut along its `split` features;
    the `no_bias`-th without a bias), rank r sent `pieces(linear, x, tp)[r]` only, and every
    rank's output equal to the whole layer's; `mistake` names the one a wrong output shows."""
    __tracebackhide__ = True
    expect_callable(fn, exercise)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        linear, x = _linear(rng, tp, bias=i != no_bias, split=split)
        # what the layer's one collective carries: each rank's block (column), the whole
        # output's partial sums (row); on 3 and 4 ranks 8 KiB or more, clear of the headers
        width = linear.out_features // tp if split == "out" else linear.out_features
        x = _wide_rows(x, width, rng) if tp > 2 else x
        where = _where(exercise, tp, linear, x)
        expected = linear(x).detach()
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        got = _run(fn, exercise, where, hint, harness, pieces(linear, x, tp), timeout, received)
        for rank, y in enumerate(got):
            expect_tensor(y, expected, where=where, rank=rank, tolerance=TOLERANCE,
                          hint=mistake(y, expected, linear, x, tp, rank), **TOL)
        carried = torch.zeros(*x.shape[:-1], width, dtype=torch.float64)
        most = (torch_received(_all_gather_of, [(carried,)] * tp, ways=("list", "tensor"))
                if split == "out" else torch_received(_all_reduce_of, [(carried,)] * tp))
        expect_received_data(received, most, where, hint)


def _column_pieces(linear, x, tp):
    """Rank r: the whole x, its rows of W (out/t, in), its entries of b (out/t,) or None."""
    rows, bias = _shards(linear.weight.detach(), tp, 0), _shards(_bias(linear), tp, 0)
    return [(x, rows[r], bias[r]) for r in range(tp)]


def _bias(linear):
    return None if linear.bias is None else linear.bias.detach()


def _column_hint(y, expected, linear, x, tp, rank):
    """Which mistake gives `y`, if it is one we know (every rank's output is the same)."""
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


@fresh_cases
def check_row_parallel_linear(row_parallel_linear, timeout=CHECK_TIMEOUT_S, *, rng):
    """row_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight this
    rank's columns (out, in/t) of W, bias the whole (out,) b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    _check_linear(row_parallel_linear, "row_parallel_linear", rng, timeout, split="in",
                  no_bias=2, pieces=_row_pieces, harness=row_in_rank, hint=ROW_HINT,
                  mistake=_row_hint)
    print("row_parallel_linear: passed on 3 cases drawn afresh (2, 3 and 4 ranks; "
          "with and without bias), equal to nn.Linear on every rank, the bias added once")


def _row_pieces(linear, x, tp):
    """Rank r: the whole x, its columns of W (out, in/t), the whole b (out,) or None."""
    columns = _shards(linear.weight.detach(), tp, 1)
    return [(x, columns[r], _bias(linear)) for r in range(tp)]


def _row_hint(y, expected, linear, x, tp, rank):
    """Which mistake gives rank `rank`'s `y`, if it is one we know."""
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
