"""Lesson 04, exercise 1 (`exercises/04_tensor_parallel.ipynb`): `check_column_parallel_linear`,
W cut by rows and the outputs all-gathered, on 2, 3 and 4 real ranks against one process's
`nn.Linear` (`layers.run_linear`); a wrong output is named by the mistake that gives it.
"""

import torch

from dlcourse.checks.core import CHECK_TIMEOUT_S, fresh_cases
from dlcourse.checks.tensor.in_rank import column_in_rank
from dlcourse.checks.tensor.layers import bias_of, close, run_linear, shards


COLUMN_HINT = ("y_r = x @ weight.T + bias is this rank's out/t output features; all-gather the "
               "y_r of every rank (dist.all_gather into a list of t tensors shaped like y_r) and "
               "torch.cat them along the last dim, in rank order")


@fresh_cases
def check_column_parallel_linear(column_parallel_linear, timeout=CHECK_TIMEOUT_S, *, rng):
    """column_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight
    this rank's rows (out/t, in) of W, bias its (out/t,) of b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    run_linear(column_parallel_linear, "column_parallel_linear", rng, timeout, split="out",
               no_bias=1, pieces=_column_pieces, harness=column_in_rank, hint=COLUMN_HINT,
               mistake=_column_hint)
    print("column_parallel_linear: passed on 3 cases drawn afresh (2, 3 and 4 ranks; "
          "with and without bias; 1 and 2 leading dims), equal to nn.Linear on every rank")


def _column_pieces(linear, x, tp):
    """Rank r: the whole x, its rows of W (out/t, in), its entries of b (out/t,) or None."""
    rows, bias = shards(linear.weight.detach(), tp, 0), shards(bias_of(linear), tp, 0)
    return [(x, rows[r], bias[r]) for r in range(tp)]


def _column_hint(y, expected, linear, x, tp, rank):
    """Which mistake gives `y`, if it is one we know (every rank's output is the same)."""
    blocks = expected.chunk(tp, dim=-1)  # what each rank computes: (..., out/t)
    if isinstance(y, torch.Tensor) and y.shape == blocks[0].shape != expected.shape:
        return "this is one rank's block of the output: all-gather the blocks of every rank"
    if close(y, torch.cat(blocks, dim=0)) or close(y, torch.stack(blocks)):
        return ("the blocks were joined along dim 0: each rank holds some output features "
                "(columns of y), so torch.cat them along the last dim")
    if close(y, torch.cat(blocks[::-1], dim=-1)):
        return "the blocks are in the wrong order: rank r's block is the r-th, left to right"
    if linear.bias is not None and close(y, expected - linear.bias.detach()):
        return "the bias is missing: add this rank's bias entries to its block before gathering"
    return COLUMN_HINT
