"""Lesson 04, exercise 7 (`exercises/04_tensor_parallel.ipynb`): `check_sequence_parallel`,
sequence parallelism's conversion pair, GatherSequence and ReduceScatterSequence (one cell, one
exercise), run around a column- and a row-parallel layer on 2, 3 and 4 real ranks
(`sequence_block.py`), every collective counted.
"""

import torch
import torch.distributed as dist

from dlcourse import pickling
from dlcourse.checks.core import (CHECK_TIMEOUT_S, CheckFailed, StudentCode, Submitted,
                                  expect_callable, expect_tensor, fail, kind, run_on_ranks)
from dlcourse.checks.core.cases import fresh_cases
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, torch_received
from dlcourse.checks.core.stubs import not_written, stub_message
from dlcourse.checks.tensor.cases import draw_tp_sizes
from dlcourse.checks.tensor.in_rank import pair_in_rank
from dlcourse.checks.tensor.sequence_block import (SEQUENCE, TOL, TOLERANCE, draw_block, rank_args,
                                                   reference)


PAIR_HINT = ("GatherSequence: forward all-gathers the ranks' (B, T/t, h) shards along dim 1 (the "
             "sequence), backward reduce-scatters the gradient along dim 1; ReduceScatterSequence "
             "the other way round")


@fresh_cases
def check_sequence_parallel(gather_sequence, reduce_scatter_sequence, timeout=CHECK_TIMEOUT_S, *,
                            rng):
    """GatherSequence and ReduceScatterSequence, autograd Functions used as `.apply(x, group)`,
    around a column- and a row-parallel layer on t real ranks: y, x's and the weights' gradients
    equal one process's, with one all-gather and one reduce-scatter each way."""
    __tracebackhide__ = True
    for fn, name in ((gather_sequence, "GatherSequence"),
                     (reduce_scatter_sequence, "ReduceScatterSequence")):
        expect_callable(fn, name)
        if not isinstance(fn, Submitted) and not _is_function_class(fn):
            fail(name, None, f"the check needs your autograd Function class itself, not "
                             f"{kind(fn)}")
        stubs = [stub_message(vars(fn)[m].__func__) for m in ("forward", "backward")
                 if not isinstance(fn, Submitted) and isinstance(vars(fn).get(m), staticmethod)]
        if any(text is not None for text in stubs):  # named here, not as the first class
            raise CheckFailed(not_written(name, next(t for t in stubs if t is not None)))
    graded = isinstance(reduce_scatter_sequence, Submitted)  # its rank has no answer module
    other = StudentCode(reduce_scatter_sequence.payload if graded
                        else pickling.dumps(reduce_scatter_sequence),
                        guard=SEQUENCE.in_rank)
    for tp in draw_tp_sizes(rng):
        # on 3 or 4 ranks a reduce-scatter receives less than gathering every rank's whole
        # tensor (on 2, gloo's receives as much): there shards of 2 WIRE_FLOOR bytes or more
        # (measured: such a gather stood ~2.9 KB above the ceiling at 1 WIRE_FLOOR on 4 ranks,
        # ~3 KB at 2 already on 3)
        x, ln, a, b, upstream = draw_block(rng, tp, 2 * WIRE_FLOOR if tp > 2 else 0)
        where = (f"sequence parallelism on {tp} ranks, x {tuple(x.shape)} cut along dim 1, "
                 f"Linear({a.in_features}, {a.out_features})")
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(gather_sequence, [(*r, other) for r in
                                                  rank_args(x, ln, a, b, upstream, tp)],
                                exercise="GatherSequence", where=where, hint=PAIR_HINT,
                                harness=pair_in_rank, guard=SEQUENCE.in_rank, timeout=timeout,
                                received=received)
        y, x_grad, grads = reference(x, ln, a, b, upstream)
        for rank, (got, _) in enumerate(outcomes):
            _expect_pair(got, rank, tp, y, x_grad, grads, x, where)
        _expect_pair_received(received, x, tp, where)
    print("GatherSequence, ReduceScatterSequence: passed on 3 cases drawn afresh "
          "(2, 3 and 4 ranks): every rank's tokens of y, of x's gradient and its weights' "
          "gradients equal one process's; forward and backward each one all-gather and one "
          "reduce-scatter of the whole (B, T, h)")


def _expect_pair_received(received, x, tp, where):
    """What each rank received, counted outside it: no more than torch's own all-gathers and
    reduce-scatters of the same shards receive (and HEADER_ROOM a peer), no less than the
    others' shards four times (two all-gathers, two reduce-scatters)."""
    __tracebackhide__ = True
    shard = x.chunk(tp, dim=1)[0]  # (B, T/t, h)
    nbytes = shard.numel() * shard.element_size()
    most = torch_received(_pair_messages, [(shard,)] * tp, ways=("list", "tensor"))
    expect_received_data(received, most, where, PAIR_HINT, least=[4 * (tp - 1) * nbytes] * tp)


def _pair_messages(shard, way):
    """torch's own messages of the pair on a rank's (B, T/t, h) shard, forward and backward:
    two all-gathers of the shards and two reduce-scatters of the whole (B, T, h), in the list
    forms or the tensor forms."""
    t = dist.get_world_size()
    flat, whole = shard.reshape(-1), torch.cat([shard] * t, dim=1)
    for _ in range(2):
        if way == "list":
            dist.all_gather([torch.empty_like(shard) for _ in range(t)], shard)
            dist.reduce_scatter(torch.empty_like(shard),
                                [c.contiguous() for c in whole.chunk(t, dim=1)])
        else:
            dist.all_gather_into_tensor(flat.new_empty(t * flat.numel()), flat)
            dist.reduce_scatter_tensor(torch.empty_like(flat), whole.transpose(0, 1).reshape(-1))


def _is_function_class(fn):
    return isinstance(fn, type) and issubclass(fn, torch.autograd.Function)


def _expect_pair(got, rank, tp, y, x_grad, grads, x, where):
    __tracebackhide__ = True
    mine = lambda t, dim=1: t.chunk(tp, dim=dim)[rank]  # noqa: E731
    expect_tensor(got["y"], mine(y), where=f"{where}, forward: y", rank=rank,
                  tolerance=TOLERANCE, hint=_y_hint(got["y"], y, tp, rank), **TOL)
    for name, want, dim in (("x", x_grad, 1), ("a.weight", grads["a.weight"], 0),
                            ("a.bias", grads["a.bias"], 0), ("b.weight", grads["b.weight"], 1)):
        expect_tensor(got[name], mine(want, dim), where=f"{where}, backward: {name}.grad",
                      rank=rank, tolerance=TOLERANCE, hint=_grad_hint(got[name], want, tp,
                                                                       rank, dim), **TOL)
    whole = x.numel() * x.element_size()  # bytes of the whole (B, T, h)
    for phase in ("forward", "backward"):
        _expect_collectives(got[phase], whole, phase, rank, where)


def _y_hint(got, y, tp, rank):
    if isinstance(got, torch.Tensor) and got.shape == y.shape:
        return ("this is the whole sequence: ReduceScatterSequence keeps this rank's tokens "
                "only, summed over the ranks")
    if isinstance(got, torch.Tensor) and got.shape != y.chunk(tp, 1)[rank].shape:
        return "the cut is along the sequence, dim 1 of (B, T, h): gather and scatter there"
    return PAIR_HINT


def _grad_hint(got, want, tp, rank, dim):
    if isinstance(got, torch.Tensor) and dim == 1 and torch.allclose(
            got, tp * want.chunk(tp, dim)[rank], **TOL):
        return (f"{tp} times too large: the gradient was summed twice (a reduce-scatter, or an "
                "all-reduce, where the other direction only gathers)")
    if dim == 1:  # x's gradient
        return ("every rank's layers used this rank's tokens, so their gradient is a sum over "
                "the ranks: GatherSequence's backward reduce-scatters along dim 1")
    return PAIR_HINT


def _expect_collectives(records, whole, phase, rank, where):
    """One all-gather of `whole` bytes and one reduce-scatter of `whole` bytes, nothing else."""
    __tracebackhide__ = True
    moved = {}
    for op, nbytes in records:
        moved[op] = moved.get(op, 0) + nbytes
    if moved == {"all_gather": whole, "reduce_scatter": whole}:
        return
    said = ", ".join(f"{op} {n} bytes" for op, n in sorted(moved.items())) or "nothing"
    fail(f"{where}, {phase}", rank, f"moved {said} in {len(records)} collectives; the pair "
                                    f"moves one all-gather of the whole (B, T, h), {whole} bytes,"
                                    f" and one reduce-scatter of it, {whole} bytes",
         "an all-reduce (or gathering every rank's whole tensor) and then keeping a slice moves "
         "t times what a reduce-scatter does; each direction needs exactly one all-gather and "
         "one reduce-scatter (dist.all_gather / dist.reduce_scatter, or their _single forms)")
