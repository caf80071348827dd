"""Lesson 04, exercise 2 (`exercises/04_tensor_parallel.ipynb`): `check_row_parallel_linear`, W
cut by columns, the partial sums all-reduced and the bias added once, on 2, 3 and 4 real ranks
against one process's `nn.Linear` (`layers.run_linear`).
"""

from dlcourse.checks.core import CHECK_TIMEOUT_S, fresh_cases
from dlcourse.checks.tensor.in_rank import row_in_rank
from dlcourse.checks.tensor.layers import bias_of, close, run_linear, shards


ROW_HINT = ("take this rank's slice of x's last dim (x.chunk(t, dim=-1)[rank]), multiply it by "
            "weight.T (a partial sum of the output), all-reduce the partial sums, then add the "
            "bias once")


@fresh_cases
def check_row_parallel_linear(row_parallel_linear, timeout=CHECK_TIMEOUT_S, *, rng):
    """row_parallel_linear(x, weight, bias, group): x (..., in) whole on every rank, weight this
    rank's columns (out, in/t) of W, bias the whole (out,) b or None -> the whole (..., out)."""
    __tracebackhide__ = True
    run_linear(row_parallel_linear, "row_parallel_linear", rng, timeout, split="in",
               no_bias=2, pieces=_row_pieces, harness=row_in_rank, hint=ROW_HINT,
               mistake=_row_hint)
    print("row_parallel_linear: passed on 3 cases drawn afresh (2, 3 and 4 ranks; "
          "with and without bias), equal to nn.Linear on every rank, the bias added once")


def _row_pieces(linear, x, tp):
    """Rank r: the whole x, its columns of W (out, in/t), the whole b (out,) or None."""
    columns = shards(linear.weight.detach(), tp, 1)
    return [(x, columns[r], bias_of(linear)) for r in range(tp)]


def _row_hint(y, expected, linear, x, tp, rank):
    """Which mistake gives rank `rank`'s `y`, if it is one we know."""
    bias = 0 if linear.bias is None else linear.bias.detach()
    w_r = linear.weight.detach().chunk(tp, dim=1)[rank]
    partial = x.chunk(tp, dim=-1)[rank] @ w_r.T  # (..., out): this rank's term
    if linear.bias is not None and close(y, expected + (tp - 1) * bias):
        return (f"the bias was added {tp} times, once on every rank before the all-reduce: add "
                "it after the all-reduce (or on one rank only, before it)")
    if linear.bias is not None and close(y, expected - bias):
        return "the bias is missing: add it once, after the all-reduce"
    if close(y, partial + bias):
        return ("this is only this rank's partial sum: all-reduce the partial sums of the "
                "ranks (dist.all_reduce) before adding the bias")
    return ROW_HINT
