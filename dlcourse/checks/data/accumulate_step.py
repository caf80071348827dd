"""Lesson 03's accumulation exercise: micro-batches under no_sync(), one synchronisation a step,
under the lesson's DataParallel and torch's DDP (the set's guide is `__init__.py`)."""

from dataclasses import dataclass
from functools import partial

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import accumulate_in_rank
from dlcourse.checks.data.replicas import (LR, batch, build, combine, count, expect_weights,
                                           explain_step, gradient_at, loss_of, optimizer, run_steps,
                                           shards, sizes_text, whole_batch)


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
# Its ranks load the lesson's data-parallel modules (`in_rank.accumulate_in_rank`), so under
# `dlcourse grade` train_step is refused there, not absent; the checks' modules are absent.
TRAIN_STEP = ANSWERS.but(packages=(), torch=(),
                         single=(("dlcourse.parallel.data.steps", "train_step"),),
                         rank_side=ANSWERS.rank_side + ("dlcourse.parallel.data.steps",))


def _check_accumulate_case(accumulate_step, case, seed, timeout):
    __tracebackhide__ = True
    W, sizes = case.world_size, case.micro_batches
    per_rank = sum(sizes)
    batches = [batch(case.model, W * per_rank, seed=seed + k) for k in range(case.steps)]
    # micro[k][r][j]: micro-batch j of rank r in step k
    micro = [[shards(s, sizes) for s in shards(b, [per_rank] * W)] for b in batches]
    where = (f"accumulate_step on {W} ranks, {case.model} in {case.wrapper}, micro-batches of "
             f"{sizes_text(sizes)} samples on each rank")
    outcomes = run_steps(accumulate_step, micro, exercise="accumulate_step", where=where,
                         hint=ACCUMULATE_HINT, timeout=timeout,
                         harness=partial(accumulate_in_rank, case.model, case.wrapper,
                                         case.bucket_cap_mb), guard=TRAIN_STEP.in_rank)
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
         f"your step weighs the {M} micro-batches equally, but they hold {sizes_text(sizes)} "
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
