"""Lesson 03, exercise 3 (`exercises/03_data_parallel.ipynb`): `check_make_buckets`, the plan of
which gradients travel together. The plan is a formula of the model, so the check calls the
student's function in this process and compares its plan with the lesson's `make_buckets`
(`dlcourse/parallel/data/buckets.py`, which tests/test_data_parallel.py holds against DDP): the
same parameters, last first, each bucket closed once it holds at least the cap.
"""

from dataclasses import dataclass

import torch

import dlcourse.parallel.data.buckets as library
from dlcourse.checks.core import call_in_process, dtype_name, expect_callable, fail, fresh_cases
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import plan_by_name
from dlcourse.checks.data.replicas import MODELS, build


MB = 2**20  # bucket_cap_mb is in MiB, as in DDP


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
