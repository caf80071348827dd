"""Lesson 03, exercise 4 (`exercises/03_data_parallel.ipynb`): `check_all_reduce_buckets`, one
all-reduce per bucket and the averages in .grad. It runs on 4, 3 and 2 real ranks, hands every
rank the lesson's plan after its own backward, and compares every `.grad` with one process's
gradient of the whole batch, watching for one all-reduce of a bucket's size per bucket, and
bounds what each rank received, counted by the kernel outside it, by what torch's own
all-reduces of the buckets receive (`core.received`).
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

import dlcourse.parallel.data.buckets as library
from dlcourse.checks.core import (CHECK_TIMEOUT_S, describe, dtype_name, expect_callable, fail,
                                  fresh_cases, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import reduce_in_rank
from dlcourse.checks.data.replicas import (MODELS, TOLERANCE, batch, build, count,
                                           expect_gradients_reduced, gradient_at, gradients,
                                           loss_of, shards, snapshot, worst_element)


@dataclass
class ReduceCase:
    world_size: int
    model: str
    dtype: torch.dtype
    bucket_cap_mb: float


REDUCE_CASES = [
    ReduceCase(4, "tied GPT", torch.float32, 0.001),  # 4 buckets
    ReduceCase(3, "MLP with idle parameters", torch.float32, 0.0001),  # 3; unused in the first
    ReduceCase(2, "MLP", torch.float64, 1.0),  # one bucket; a float32 buffer is half the size
    # one bucket of 8.5 KiB on 4 ranks: gathered whole from every rank instead of all-reduced,
    # it brings each rank ~11 KiB more than gloo's all-reduce, clear of the headers
    ReduceCase(4, "tied GPT", torch.float64, 1.0),
]
REDUCE_HINT = ("for each bucket: torch.cat the flattened gradients (zeros for a parameter whose "
               ".grad is None) into one tensor, dist.all_reduce it once, divide by the world "
               "size, and copy each piece back into its parameter's .grad, in the order you "
               "packed (split by numel, view_as(p))")


@fresh_cases
def check_all_reduce_buckets(all_reduce_buckets, timeout=CHECK_TIMEOUT_S, *, rng):
    """all_reduce_buckets(buckets, group), after each rank's backward, must leave in every .grad
    the average over the ranks (the whole batch's gradient), with one all-reduce per bucket."""
    __tracebackhide__ = True
    expect_callable(all_reduce_buckets, "all_reduce_buckets")
    drawn = ReduceCase(rng.randint(2, 4), rng.choice(list(MODELS)), torch.float32,
                       rng.uniform(0, 0.002))
    for case in REDUCE_CASES + [drawn]:
        _check_reduce_case(all_reduce_buckets, case, rng.randrange(2**31), timeout)
    print(f"all_reduce_buckets: passed on {len(REDUCE_CASES) + 1} cases (4, 3, 2 ranks; MLP, tied "
          "GPT, parameters without gradients; 4, 3 and 1 buckets; float32 and float64), equal "
          "to one process on the whole batch, one all-reduce per bucket, each rank receiving "
          "no more than torch's all-reduces of the buckets do (counted outside it)")


def _check_reduce_case(all_reduce_buckets, case, seed, timeout):
    __tracebackhide__ = True
    W, dtype = case.world_size, case.dtype
    x, y = batch(case.model, 2 * W, seed=seed, dtype=dtype)
    per_rank = shards((x, y), [2] * W)
    model = build(case.model, dtype)
    plan = library.make_buckets(model, case.bucket_cap_mb)
    where = (f"all_reduce_buckets on {W} ranks, {case.model} in "
             f"{dtype_name(dtype)}, {count(len(plan), 'bucket')} "
             f"({', '.join(f'{b.nbytes:,}' for b in plan)} bytes)")
    received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
    outcomes = run_on_ranks(all_reduce_buckets, [(s,) for s in per_rank],
                            exercise="all_reduce_buckets", where=where, hint=REDUCE_HINT,
                            timeout=timeout,
                            harness=partial(reduce_in_rank, case.model, dtype, _names(plan, model)),
                            guard=ANSWERS.in_rank, received=received)
    initial = snapshot(model)
    loss_of(case.model)(model(x), y).backward()
    expected = gradients(model)  # one process, the whole batch
    for rank, ((_, _, events), _) in enumerate(outcomes):
        _expect_one_per_bucket(events, plan, where, rank)
    for rank, ((grads, weights, _), _) in enumerate(outcomes):
        for name, want in expected.items():
            explain = partial(_explain_average, grads[name], want, name, initial, case,
                              per_rank[rank])
            _expect_average(grads[name], want, name, where, rank, explain)
        for name, value in initial.items():
            if not torch.equal(weights[name], value):
                fail(where, rank, f"changed the values of parameter {name}",
                     "all_reduce_buckets only averages the gradients; the optimizer changes "
                     "the parameters")
    _expect_buckets_received(received, plan, dtype, W, where)


def _expect_buckets_received(received, plan, dtype, W, where):
    """What each rank received, counted outside it: no more than torch's own all-reduce of each
    bucket receives (gloo's algorithm: a formula would be its, not the exercise's) and
    HEADER_ROOM a peer; no less than the (W - 1)/W of the buckets that any all-reduce brings.
    The tied GPT's one float64 bucket on 4 ranks, gathered whole from every rank instead (3
    times its bytes, gloo's all-reduce ~1.7), stands clear of the headers."""
    __tracebackhide__ = True
    sizes = [b.nbytes for b in plan]
    most = torch_received(_bucket_messages, [(sizes, dtype)] * W)
    least = sum((W - 1) * n // W for n in sizes)
    expect_received_data(received, most, where, REDUCE_HINT, least=[least] * W)


def _bucket_messages(sizes, dtype, way):
    """torch's own all-reduce of each bucket, `sizes` its bytes."""
    for nbytes in sizes:
        dist.all_reduce(torch.zeros(nbytes // dtype.itemsize, dtype=dtype))


def _names(plan, model):
    """The lesson's plan (its Buckets) as each bucket's parameter names, for the ranks."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in bucket.params] for bucket in plan]


def _expect_one_per_bucket(events, plan, where, rank):
    __tracebackhide__ = True
    expect_gradients_reduced(events, where, rank, "pack the gradients (p.grad), not the "
                                                  "parameters")
    sizes = [nbytes for op, nbytes, _ in events if op == "all_reduce"]
    bucket_sizes = [b.nbytes for b in plan]
    n_params = sum(len(b.params) for b in plan)
    if len(sizes) != len(plan):
        per = (", one per parameter: the point of a bucket is one call for many gradients"
               if len(sizes) >= n_params - 1 and len(plan) < n_params else "")
        fail(where, rank, f"made {count(len(sizes), 'all-reduce')} for "
                          f"{count(len(plan), 'bucket')}{per}", REDUCE_HINT)
    if sorted(sizes) != sorted(bucket_sizes):
        fail(where, rank, f"all-reduced {', '.join(f'{s:,}' for s in sizes)} bytes; the buckets "
                          f"hold {', '.join(f'{s:,}' for s in bucket_sizes)} bytes of gradients",
             "pack every parameter of a bucket, zeros for one whose .grad is None, so that "
             "every rank's buffer has the same layout, in the gradients' dtype (torch.cat keeps "
             "it; torch.zeros(n) alone is float32). " + REDUCE_HINT)


def _expect_average(got, want, name, where, rank, explain):
    __tracebackhide__ = True
    if want is None:
        if got is not None:
            fail(where, rank, f"gave parameter {name} a gradient, but no rank computed one",
                 "leave a .grad that is None as it is, as one process would (pack zeros for it "
                 "in the buffer, but do not unpack into it)")
        return
    if got is None:
        fail(where, rank, f"left parameter {name} without a gradient", REDUCE_HINT)
    if got.shape != want.shape or got.dtype != want.dtype:
        fail(where, rank, f"left parameter {name} a .grad of {describe(got)}, expected "
                          f"{describe(want)}", REDUCE_HINT)
    tol = TOLERANCE[want.dtype]
    gap = (got - want).abs()
    if (gap > tol).any():
        at, worst = worst_element(gap)
        fail(where, rank, f"left parameter {name} a wrong .grad:{at} is {got[worst].item():.6g}, "
                          f"the whole batch's gradient is {want[worst].item():.6g} "
                          f"({int((gap > tol).sum())} of {gap.numel()} differ by more than "
                          f"{tol:g}, the rounding allowed)", explain())


def _explain_average(got, want, name, initial, case, shard):
    """Say what a wrong averaged gradient holds instead."""
    if torch.allclose(got, case.world_size * want, rtol=1e-4, atol=1e-7):
        return "it holds the sum over the ranks: divide the all-reduced buffer by the world size"
    own = gradient_at(case.model, initial, *shard, dtype=case.dtype)[name]
    if torch.allclose(got, own, rtol=1e-4, atol=1e-7):
        return ("it still holds this rank's own gradient: copy the all-reduced buffer back into "
                "p.grad (p.grad.copy_(...); `grad = ...` only rebinds a name)")
    if torch.allclose(got, initial[name]):
        return "it holds the parameter's values: pack p.grad, not p"
    return REDUCE_HINT
