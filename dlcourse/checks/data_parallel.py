"""Checks for lesson 03's exercises (`exercises/03_data_parallel.ipynb`): data parallelism by hand.

    check_broadcast_parameters(broadcast_parameters)  every rank starts from rank 0's weights
    check_data_parallel_step(data_parallel_step)     steps equal to one process's on the batch
    check_make_buckets(make_buckets)                 the plan: which gradients travel together
    check_all_reduce_buckets(all_reduce_buckets)     one all-reduce per bucket, averages in .grad
    check_accumulate_step(accumulate_step)           micro-batches under no_sync(), one sync a step

The bucket checks are in `buckets.py`, the others here; the pieces they share in `replicas.py`.
Each runs the student's code on 4, 3 and 2 real gloo ranks with models the notebook never shows (a
small MLP, the course GPT with its tied embedding and output weight, an MLP with a parameter no
layer uses and a frozen one), and compares every rank's weights after every step (or gradients)
with one process training the same model on the whole batch. Accumulation runs under the lesson's
`DataParallel` and under torch's `DistributedDataParallel`: the same loop must work with both.

SGD is the sharp reference: it moves a weight by lr x gradient, so the check reads back the
gradient a step used and names the mistake that gives it (the sum over ranks, a rank's own, equal
weights for unequal shards, the previous step's left in .grad, ...). AdamW would hide a missing
divide (it divides by the gradient's own size), but unlike SGD it is not linear, so one AdamW case
catches parameters averaged after each rank's own step. What each rank communicated is watched:
no all-reduce of a parameter's values, none before the last micro-batch, one per bucket.
"""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

import dlcourse.parallel.data.compare as compare
from dlcourse.checks.buckets import check_all_reduce_buckets, check_make_buckets
from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases,
                                  run_on_ranks)
from dlcourse.checks.replicas import (
    MODELS, OPTIMIZERS, Watch, batch, build, combine, count,
    expect_gradients_reduced, expect_weights, explain_step, gradient_at, loss_of, optimizer,
    DATA_PARALLEL, shards, snapshot, whole_batch,
)

__all__ = ["check_broadcast_parameters", "check_data_parallel_step", "check_make_buckets",
           "check_all_reduce_buckets", "check_accumulate_step"]
LR = OPTIMIZERS["SGD"][1]


def _sizes(sizes):
    return ", ".join(map(str, sizes))


# ---------------------------------------------------------------- exercise 1: one start

BROADCAST_CASES = [(4, "tied GPT"), (3, "MLP with idle parameters"), (2, "MLP")]
BROADCAST_HINT = ("every rank built its model from its own random seed, as separate processes "
                  "do: copy the group's first rank's value into every parameter (frozen ones "
                  "too) on every rank, broadcasting each p.data from it in the same order; "
                  "dist.broadcast names it by its global rank, dist.get_global_rank(group, 0)")


@fresh_cases
def check_broadcast_parameters(broadcast_parameters, timeout=CHECK_TIMEOUT_S, *, rng):
    """broadcast_parameters(model, group) must leave every rank with rank 0's parameters, when
    every rank built its model from a different seed."""
    __tracebackhide__ = True
    expect_callable(broadcast_parameters, "broadcast_parameters")
    cases = BROADCAST_CASES + [(rng.randint(2, 4), rng.choice(list(MODELS)))]
    for W, name in cases:
        where = f"broadcast_parameters on {W} ranks, {name}, each rank from its own seed"
        first = rng.randrange(2**31)  # rank r builds its model from seed first + r
        outcomes = run_on_ranks(broadcast_parameters, [()] * W, exercise="broadcast_parameters",
                                where=where, hint=BROADCAST_HINT, timeout=timeout,
                                harness=partial(_broadcast_in_rank, name, first),
                                guard=DATA_PARALLEL.in_rank)
        starts = [snapshot(build(name, seed=first + r)) for r in range(W)]
        for rank, (weights, _) in enumerate(outcomes):
            _expect_broadcast(weights, starts, rank, where)
    print(f"broadcast_parameters: passed on {len(cases)} cases (4, 3, 2 ranks; tied "
          "GPT, MLP, a frozen parameter), every rank holds rank 0's weights")


def _broadcast_in_rank(name, first, broadcast_parameters):
    """Runs in every rank: its own random start, then the student's broadcast."""
    model = build(name, seed=first + dist.get_rank())
    broadcast_parameters(model, dist.group.WORLD)
    return snapshot(model)


def _expect_broadcast(got, starts, rank, where):
    __tracebackhide__ = True
    for name, want in starts[0].items():
        if torch.equal(got[name], want):
            continue
        holder = next((q for q, start in enumerate(starts) if torch.equal(got[name], start[name])),
                      None)
        if holder == rank:
            problem = f"kept its own initial value of {name}: nothing was copied into it"
        elif holder is not None:
            problem = f"holds rank {holder}'s initial value of {name}, not rank 0's"
        else:
            problem = f"holds a value of {name} that is neither its own initial one nor rank 0's"
        fail(where, rank, problem, BROADCAST_HINT)


# ---------------------------------------------------------------- exercise 2: the step

@dataclass
class StepCase:
    world_size: int
    model: str
    shards: tuple  # samples on each rank: unequal shards weigh rank r's loss by n_r / N
    optimizer: str
    steps: int = 2


STEP_CASES = [
    StepCase(4, "MLP", (3, 3, 3, 3), "SGD", steps=3),
    StepCase(3, "tied GPT", (1, 4, 2), "SGD"),
    StepCase(2, "MLP with idle parameters", (5, 3), "SGD"),
    StepCase(2, "MLP", (2, 2), "AdamW"),  # parameters averaged after the step fail here only
]
STEP_HINT = ("zero the gradients; backward on the rank's mean loss weighted by n_r / N (N: an "
             "all-reduce of the ranks' sample counts); all-reduce each p.grad (skip one that is "
             "None); then optimizer.step()")


@fresh_cases
def check_data_parallel_step(data_parallel_step, timeout=CHECK_TIMEOUT_S, *, rng):
    """data_parallel_step(model, optimizer, x, y, loss_fn, group), called on every rank with its
    shard (x, y) of a batch, must leave every rank with the weights one process gets from the
    same step on the whole batch."""
    __tracebackhide__ = True
    expect_callable(data_parallel_step, "data_parallel_step")
    W = rng.randint(2, 4)
    cases = STEP_CASES + [StepCase(W, rng.choice(list(MODELS)),
                                   tuple(rng.randint(1, 5) for _ in range(W)), "SGD")]
    for case in cases:
        _check_step_case(data_parallel_step, case, rng.randrange(2**31), timeout)
    print(f"data_parallel_step: passed on {len(cases)} cases (4, 3, 2 ranks; MLP, tied "
          "GPT, parameters without gradients; equal and unequal shards; SGD and AdamW), equal "
          "to one process on the whole batch")


def _check_step_case(data_parallel_step, case, seed, timeout):
    __tracebackhide__ = True
    n, W = sum(case.shards), case.world_size
    batches = [batch(case.model, n, seed=seed + k) for k in range(case.steps)]
    where = (f"data_parallel_step on {W} ranks, {case.model}, {n} samples in shards of "
             f"{_sizes(case.shards)}, {case.optimizer}")
    steps = [shards(b, case.shards) for b in batches]  # steps[k][r]: rank r's (x, y) in step k
    outcomes = run_on_ranks(data_parallel_step, [([s[r] for s in steps],) for r in range(W)],
                            exercise="data_parallel_step", where=where, hint=STEP_HINT,
                            timeout=timeout, harness=partial(_step_in_rank, case), guard=DATA_PARALLEL.in_rank)
    model = build(case.model)
    expected = whole_batch(model, optimizer(case.optimizer, model.parameters()), batches,
                           loss_of(case.model))
    for rank, ((_, events), _) in enumerate(outcomes):
        expect_gradients_reduced(events, where, rank, "average the gradients (p.grad) between "
                                                      "loss.backward() and optimizer.step()")
    for k in range(1, case.steps + 1):
        for rank, ((weights, _), _) in enumerate(outcomes):
            explain = partial(_explain_data_parallel_step, case, steps, expected, weights, k,
                              rank)
            expect_weights(weights[k], expected[k], where=where, rank=rank, step=k,
                           explain=explain)


def _step_in_rank(case, data_parallel_step, steps):
    """Runs in every rank: the same start (as after a broadcast), then the student's steps."""
    model = build(case.model)
    opt = optimizer(case.optimizer, model.parameters())
    weights = [snapshot(model)]
    with Watch(model) as watch:
        for x, y in steps:
            data_parallel_step(model, opt, x, y, loss_of(case.model), dist.group.WORLD)
            weights.append(snapshot(model))
    return weights, watch.events


def _explain_data_parallel_step(case, steps, expected, weights, k, rank):
    """What went wrong in step k on this rank, read from the gradient the step used."""
    W, sizes, n = case.world_size, case.shards, sum(case.shards)
    if case.optimizer != "SGD":  # the SGD cases passed: this one is not linear in the gradient
        return ("the SGD cases passed but AdamW's did not. AdamW's step is not linear in the "
                "gradient, so averaging the parameters after each rank's own step is not "
                "averaging the gradients before one step (and each rank's optimizer state "
                "holds its own gradients): all-reduce p.grad between backward and "
                "optimizer.step()")
    own = [gradient_at(case.model, expected[k - 1], *steps[k - 1][r]) for r in range(W)]
    right = combine([(m / n, g) for m, g in zip(sizes, own)])  # the whole batch's
    candidates = [
        (combine([(W, right)]), f"your step is {W} times the whole batch's: the all-reduce sums "
                                "the ranks' gradients; divide by the world size", False),
        (combine([(1, g) for g in own]), f"your step is the sum of the {W} ranks' gradients: "
                                         "the all-reduce sums; divide by the world size", False),
        (own[rank], f"rank {rank} stepped with its own shard's gradient alone: the all-reduce "
                    "did not reach p.grad before optimizer.step()", True),
        (combine([(1 / W, g) for g in own]),
         f"your step weighs the {W} ranks equally, but they hold {_sizes(sizes)} of the {n} "
         "samples, so a sample on a small rank counts more than one on a big rank. Each rank's "
         "loss is a mean over its own samples: weigh rank r's by n_r / N before summing, with N "
         "from an all-reduce of the ranks' len(x), not a count assumed equal", False),
        (combine([(1 / W, right)]), f"your step is 1/{W} of the whole batch's: with each loss "
                                    "weighted by n_r / N the all-reduced sum is already the "
                                    "whole batch's gradient; do not divide it again", False),
    ]
    if k > 1:
        old = [gradient_at(case.model, expected[k - 2], *steps[k - 2][r]) for r in range(W)]
        old = combine([(m / n, g) for m, g in zip(sizes, old)])
        hint = (f"step {k} also used step {k - 1}'s gradient, still in p.grad: clear the "
                "gradients at the start of each step (optimizer.zero_grad())")
        # averaged: mean(old + g_r) = old + mean(g_r); summed: sum(old + g_r) = W old + sum(g_r)
        candidates += [(combine([(1, right), (c, old)]), hint, False) for c in (1, W)]
    return explain_step(weights[k - 1], weights[k], LR, candidates, STEP_HINT)


# ---------------------------------------------------------------- exercise 5: accumulation

@dataclass
class AccumulateCase:
    world_size: int
    model: str
    wrapper: str  # "DataParallel" (the lesson's) or "torch DDP"
    micro_batches: tuple  # samples in each micro-batch, the same on every rank
    bucket_cap_mb: float
    steps: int = 2


ACCUMULATE_CASES = [
    AccumulateCase(4, "MLP", "DataParallel", (3, 3, 2), 0.0001),  # 3 buckets
    AccumulateCase(3, "tied GPT", "DataParallel", (2, 1), 0.001),  # 4 buckets
    AccumulateCase(2, "MLP", "torch DDP", (2, 2, 2, 2), 0.0001),  # the same loop runs with DDP
]
WRAPPERS = {"DataParallel": "overlapped", "torch DDP": compare.DDP}  # compare.wrap's names
ACCUMULATE_HINT = ("zero the gradients once; run forward and backward of every micro-batch but "
                   "the last inside `with model.no_sync():`, each loss weighted by x.size(0) / "
                   "(samples in all micro-batches); the last one outside it; then "
                   "optimizer.step()")


@fresh_cases
def check_accumulate_step(accumulate_step, timeout=CHECK_TIMEOUT_S, *, rng):
    """accumulate_step(model, optimizer, micro_batches, loss_fn) with a data-parallel model
    (the lesson's DataParallel or torch DDP) must take the step one process takes on every
    rank's micro-batches together, synchronising once, after the last micro-batch."""
    __tracebackhide__ = True
    expect_callable(accumulate_step, "accumulate_step")
    drawn = AccumulateCase(rng.randint(2, 4), rng.choice(["MLP", "tied GPT"]), "DataParallel",
                           tuple(rng.randint(1, 3) for _ in range(rng.randint(2, 3))), 0.0001)
    cases = ACCUMULATE_CASES + [drawn]
    for case in cases:
        _check_accumulate_case(accumulate_step, case, rng.randrange(2**31), timeout)
    print(f"accumulate_step: passed on {len(cases)} cases (4, 3, 2 ranks; MLP and "
          "tied GPT; the lesson's DataParallel and torch DDP; equal and unequal micro-batches), "
          "equal to one process on the whole batch, one synchronisation per step")


# The wrapper's machinery (the lesson's DataParallel, torch's DDP) runs inside the student's step:
# only the lesson's train_step, and these checks' own functions, are refused there.
TRAIN_STEP = DATA_PARALLEL.but(packages=(), torch=(),
                               single=(("dlcourse.parallel.data.steps", "train_step"),))


def _check_accumulate_case(accumulate_step, case, seed, timeout):
    __tracebackhide__ = True
    W, sizes = case.world_size, case.micro_batches
    per_rank = sum(sizes)
    batches = [batch(case.model, W * per_rank, seed=seed + k) for k in range(case.steps)]
    # micro[k][r][j]: micro-batch j of rank r in step k
    micro = [[shards(s, sizes) for s in shards(b, [per_rank] * W)] for b in batches]
    where = (f"accumulate_step on {W} ranks, {case.model} in {case.wrapper}, micro-batches of "
             f"{_sizes(sizes)} samples on each rank")
    outcomes = run_on_ranks(accumulate_step, [([m[r] for m in micro],) for r in range(W)],
                            exercise="accumulate_step", where=where, hint=ACCUMULATE_HINT,
                            timeout=timeout, harness=partial(_accumulate_in_rank, case),
                            guard=TRAIN_STEP.in_rank)
    model = build(case.model)
    expected = whole_batch(model, optimizer("SGD", model.parameters()), batches,
                           loss_of(case.model))
    for k in range(1, case.steps + 1):
        for rank, ((_, events, n_buckets), _) in enumerate(outcomes):
            _expect_one_sync(events[k - 1], len(sizes), n_buckets, where, rank, k)
        for rank, ((weights, _, _), _) in enumerate(outcomes):
            explain = partial(_explain_accumulate, case, micro, expected, weights, k)
            expect_weights(weights[k], expected[k], where=where, rank=rank, step=k,
                           explain=explain)


def _accumulate_in_rank(case, accumulate_step, steps):
    """Runs in every rank: the model wrapped, then the student's step on each step's
    micro-batches, watched (all-reduces, and each call of loss_fn)."""
    model = compare.wrap(WRAPPERS[case.wrapper], build(case.model), dist.group.WORLD,
                         bucket_cap_mb=case.bucket_cap_mb)
    n_buckets = len(model.buckets) if case.wrapper == "DataParallel" else None
    opt = optimizer("SGD", model.parameters())
    weights, events = [snapshot(model.module)], []
    for micro_batches in steps:
        with Watch(model.module) as watch:
            accumulate_step(model, opt, micro_batches, watch.marked(loss_of(case.model)))
        weights.append(snapshot(model.module))
        events.append(watch.events)
    return weights, events, n_buckets


def _expect_one_sync(events, M, n_buckets, where, rank, k):
    """One synchronisation per step: all-reduces only after the last micro-batch's loss, one per
    bucket (counted for DataParallel, whose buckets are known)."""
    __tracebackhide__ = True
    losses = sum(op == "loss" for op, _, _ in events)
    if losses != M:
        fail(where, rank, f"called loss_fn {count(losses, 'time')} in step {k} for {M} "
                          "micro-batches",
             "one forward, loss and backward per micro-batch: accumulation is for batches too "
             "big for one forward")
    seen = 0
    for op, _, _ in events:
        seen += op == "loss"
        if op == "all_reduce" and seen < M:
            fail(where, rank, f"synchronised the gradients in step {k} after micro-batch {seen} "
                              f"of {M}, before the last",
                 "a backward outside no_sync() averages the gradients over the ranks: run every "
                 "micro-batch but the last (its forward and backward) inside `with "
                 "model.no_sync():`, so the ranks communicate once per step")
    reduces = sum(op == "all_reduce" for op, _, _ in events)
    if reduces == 0:
        fail(where, rank, f"made no all-reduce in step {k}: the gradients were never averaged",
             "run the last micro-batch's forward and backward outside no_sync(): the wrapper "
             "decides at forward time, as DDP does, whether that backward synchronises")
    if n_buckets is not None and reduces != n_buckets:
        fail(where, rank, f"made {count(reduces, 'all-reduce')} in step {k}, expected "
                          f"{n_buckets}: one per bucket, once per step",
             "the wrapper averages the gradients during the last backward; do not all-reduce "
             "them yourself as well")


def _explain_accumulate(case, micro, expected, weights, k):
    """What went wrong in step k, read from the gradient the SGD step used."""
    W, sizes, M = case.world_size, case.micro_batches, len(case.micro_batches)
    n = sum(sizes)

    def per_micro_batch(step):  # [mean over ranks of micro-batch j's gradient]
        return [combine([(1 / W, gradient_at(case.model, expected[step - 1],
                                             *micro[step - 1][r][j])) for r in range(W)])
                for j in range(M)]

    g = per_micro_batch(k)
    right = combine([(m / n, gj) for m, gj in zip(sizes, g)])
    candidates = [
        (combine([(1, gj) for gj in g]), f"your step is the sum of the {M} micro-batches' "
                                         "gradients: each micro-batch's loss is a mean over its "
                                         "own samples; weigh it by its share, x.size(0) / "
                                         f"{n} samples on this rank", False),
        (combine([(1 / M, gj) for gj in g]),
         f"your step weighs the {M} micro-batches equally, but they hold {_sizes(sizes)} "
         f"samples: weigh each micro-batch's loss by x.size(0) / {n}, not 1 / {M}", False),
        (combine([(1 / W, right)]), f"your step is 1/{W} of the whole batch's: the wrapper "
                                    "already averages over the ranks; weigh each micro-batch by "
                                    "its share of this rank's samples, not of all ranks'", False),
        (g[-1], "only the last micro-batch's gradient reached the step: zero the gradients once, "
                "before the first micro-batch, not inside the loop", True),
    ]
    if k > 1:
        old = combine([(m / n, gj) for m, gj in zip(sizes, per_micro_batch(k - 1))])
        candidates.append((combine([(1, right), (1, old)]),
                           f"step {k} also used step {k - 1}'s gradient, still in p.grad: zero "
                           "the gradients at the start of each step (optimizer.zero_grad())",
                           False))
    return explain_step(weights[k - 1], weights[k], LR, candidates, ACCUMULATE_HINT)
