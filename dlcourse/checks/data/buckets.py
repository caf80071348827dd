"""Checks for lesson 03's exercises 3 and 4 (`exercises/03_data_parallel.ipynb`): gradient buckets.

    check_make_buckets(make_buckets)                the plan: which gradients travel together
    check_all_reduce_buckets(all_reduce_buckets)    one all-reduce per bucket, averages in .grad

The plan is a formula of the model, so `check_make_buckets` calls the student's function in this
process and compares its plan with the lesson's `make_buckets` (`dlcourse/parallel/data/buckets.py`,
which tests/test_data_parallel.py holds against DDP): the same parameters, last first, each
bucket closed once it holds at least the cap. `check_all_reduce_buckets` runs on 4, 3 and 2 real
ranks, hands every rank that plan after its own backward, and compares every `.grad` with one
process's gradient of the whole batch, watching for one all-reduce of a bucket's size per bucket,
and bounds what each rank received, counted by the kernel outside it, by what torch's own
all-reduces of the buckets receive (`core.received`). The package's `__init__` exports both,
so a grader cell finds every lesson-03 check there.
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

import dlcourse.parallel.data.buckets as library
from dlcourse.checks.core import (CHECK_TIMEOUT_S, call_in_process, describe, dtype_name,
                                  expect_callable, fail, fresh_cases, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import plan_by_name, reduce_in_rank
from dlcourse.checks.data.replicas import (MODELS, TOLERANCE, batch, build, count,
                                           expect_gradients_reduced, gradient_at, gradients,
                                           loss_of, shards, snapshot, worst_element)

MB = 2**20  # bucket_cap_mb is in MiB, as in DDP

# ---------------------------------------------------------------- exercise 3: the plan


@dataclass
class PlanCase:
    model: str
    dtype: torch.dtype
    bucket_cap_mb: float


# The MLP's gradients, last parameter first, are 12, 84, 28, 196, 28 and 140 bytes in float32.
PLAN_CASES = [
    PlanCase("tied GPT", torch.float32, 0.001),  # 4 buckets; the tied matrix once, last
    PlanCase("MLP", torch.float32, 124 / MB),  # 12 + 84 + 28 = 124 bytes: exactly full
    PlanCase("MLP with idle parameters", torch.float32, 0),  # each alone; none frozen
    PlanCase("MLP", torch.float64, 0.00019),  # 8-byte elements; 199.2 bytes, not 190 (MB)
    PlanCase("MLP", torch.float32, 1.0),  # everything fits in one bucket
]
PLAN_HINT = ("take the parameters with requires_grad from the last to the first of "
             "model.parameters(); add each to the open bucket and close it as soon as it "
             "holds at least bucket_cap_mb x 2**20 bytes (p.numel() * p.element_size() each)")


@fresh_cases
def check_make_buckets(make_buckets, *, rng):
    """make_buckets(model, bucket_cap_mb) must return the lesson's plan: lists of the model's
    trainable Parameters, last first, each list closed once it holds at least the cap."""
    __tracebackhide__ = True
    expect_callable(make_buckets, "make_buckets")
    drawn = PlanCase(rng.choice(list(MODELS)), rng.choice((torch.float32, torch.float64)),
                     rng.uniform(0, 0.002))
    for case in PLAN_CASES + [drawn]:
        model = build(case.model, case.dtype)
        cap = case.bucket_cap_mb * MB
        where = (f"make_buckets(model, bucket_cap_mb={case.bucket_cap_mb:.6g}) of the "
                 f"{case.model} in {dtype_name(case.dtype)}, a cap of "
                 f"{cap:,.1f} bytes")
        expected = [b.params for b in library.make_buckets(model, case.bucket_cap_mb)]
        got = call_in_process(make_buckets, (model, case.bucket_cap_mb), exercise="make_buckets",
                              where=where, hint=PLAN_HINT,
                              guard=ANSWERS.in_process, answer=plan_by_name)
        _compare_plan(got, expected, model, cap, where)
    print(f"make_buckets: passed on {len(PLAN_CASES) + 1} cases (MLP, tied GPT, parameters without "
          "gradients; caps of 0, exactly full and one bucket; float32 and float64), equal to "
          "the lesson's plan")


def _compare_plan(got, expected, model, cap, where):
    """`got`: the student's plan by name (`plan_by_name`); `expected`: the library's."""
    __tracebackhide__ = True
    names = {id(p): n for n, p in model.named_parameters()}
    if isinstance(got, dict):
        fail(where, None, f"returned {got['not']}, expected a list of buckets, each a list of "
                          "parameters", PLAN_HINT)
    for i, bucket in enumerate(got):
        if not bucket:
            fail(where, None, f"bucket {i} is empty", "open a new bucket only for a parameter")
        for p in bucket:
            if isinstance(p, dict):
                fail(where, None, f"bucket {i} holds {p['not']}, which is not one of the model's "
                                  "parameters", "put the Parameter objects themselves in the "
                                                "buckets (from model.parameters()), not their "
                                                ".grad, .data or a copy")
    flat = [p for b in got for p in b]
    want = [names[id(p)] for b in expected for p in b]
    _expect_each_once(flat, want, model, where)
    if flat != want:
        at = next(i for i, (a, b) in enumerate(zip(flat, want)) if a != b)
        fail(where, None, f"the parameters are in another order: number {at} of the plan is "
                          f"{flat[at]}, expected {want[at]}",
             "take the parameters from the last to the first of model.parameters() "
             "(reversed(...)): the order in which backward produces their gradients")
    by_name = dict(model.named_parameters())
    for i, (bucket, right) in enumerate(zip(got, expected)):
        if len(bucket) != len(right):
            _explain_boundary(i, [by_name[n] for n in bucket], right, names, cap, where)


def _expect_each_once(flat, want, model, where):
    __tracebackhide__ = True
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    for name in flat:
        if name in frozen:
            fail(where, None, f"the plan holds {name}, which has requires_grad=False",
                 "a frozen parameter never gets a gradient: leave out every p without "
                 "p.requires_grad")
        if flat.count(name) > 1:
            tied = (" (lm_head.weight is tok_emb.weight: one Parameter used twice, listed "
                    "once by model.parameters())" if name == "tok_emb.weight" else "")
            fail(where, None, f"the plan holds {name} {flat.count(name)} times{tied}",
                 "put each Parameter in one bucket: take them from model.parameters(), not "
                 "from every module or named_parameters(remove_duplicate=False)")
    missing = [n for n in want if n not in flat]
    if missing:
        more = f" (nor are {len(missing) - 1} more)" if len(missing) > 1 else ""
        fail(where, None, f"parameter {missing[0]} is in no bucket{more}",
             "every trainable parameter goes in a bucket; after the loop, add the last bucket "
             "even if it holds less than the cap")


def _nbytes(params):
    return sum(p.numel() * p.element_size() for p in params)


def _explain_boundary(i, bucket, right, names, cap, where):
    __tracebackhide__ = True
    full, have = _nbytes(right), _nbytes(bucket)
    if len(bucket) > len(right):
        exactly = (f"; {full:,} bytes is exactly the cap, and a bucket that reaches it is full "
                   "(>=, not >)" if full == cap else "")
        fail(where, None, f"bucket {i} goes on past the cap: it held {full:,} bytes, at least "
                          f"the cap of {cap:,.1f}, once it had {names[id(right[-1])]}, but "
                          f"you close it later, at {have:,} bytes",
             f"close a bucket as soon as it holds at least the cap{exactly}. {PLAN_HINT}")
    fail(where, None, f"bucket {i} closes at {have:,} bytes after {names[id(bucket[-1])]}, "
                      f"below the cap of {cap:,.1f} bytes",
         "keep adding parameters until the bucket holds at least the cap. bucket_cap_mb is in "
         "MiB, 2**20 bytes (not 10**6), and a parameter's bytes are p.numel() * "
         "p.element_size(): 8 per element in float64")


# ---------------------------------------------------------------- exercise 4: the all-reduce

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
