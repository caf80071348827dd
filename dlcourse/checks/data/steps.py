"""Lesson 03's broadcast and step checks (the set's guide is `__init__.py`)."""

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases,
                                  run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import broadcast_in_rank, step_in_rank
from dlcourse.checks.data.replicas import (MODELS, OPTIMIZERS, batch, build, combine,
                                           expect_gradients_reduced, expect_weights, explain_step,
                                           gradient_at, loss_of, optimizer, run_steps, shards,
                                           snapshot, whole_batch)

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
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(broadcast_parameters, [()] * W, exercise="broadcast_parameters",
                                where=where, hint=BROADCAST_HINT, timeout=timeout,
                                harness=partial(broadcast_in_rank, name, first),
                                guard=ANSWERS.in_rank, received=received)
        starts = [snapshot(build(name, seed=first + r)) for r in range(W)]
        for rank, (weights, _) in enumerate(outcomes):
            _expect_broadcast(weights, starts, rank, where)
        _expect_broadcast_received(received, name, W, where)
    print(f"broadcast_parameters: passed on {len(cases)} cases (4, 3, 2 ranks; tied "
          "GPT, MLP, a frozen parameter), every rank holds rank 0's weights")


def _expect_broadcast_received(received, name, W, where):
    """What each rank received, counted outside it: no more than torch's own broadcasts from
    rank 0 of everything a model could be said to hold (its state_dict, where a tied matrix is
    there twice, and its buffers) and HEADER_ROOM a peer; a rank other than 0 no less than the
    parameters' bytes. Every rank's parameters gathered to keep rank 0's fail on 4 ranks (3
    times the tied GPT's 4 KiB)."""
    __tracebackhide__ = True
    most = torch_received(_broadcast_messages, [(name,)] * W)
    nbytes = sum(p.numel() * p.element_size() for p in build(name).parameters())
    expect_received_data(received, most, where, BROADCAST_HINT,
                         least=[0] + [nbytes] * (W - 1))


def _broadcast_messages(name, way):
    """torch's own broadcast from rank 0 of the model's state_dict and buffers, one by one."""
    model = build(name)
    for t in [*model.state_dict().values(), *model.buffers()]:
        dist.broadcast(t.data, src=0)


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
    outcomes = run_steps(data_parallel_step, steps, exercise="data_parallel_step", where=where,
                         hint=STEP_HINT, timeout=timeout,
                         harness=partial(step_in_rank, case.model, case.optimizer),
                         guard=ANSWERS.in_rank)
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
