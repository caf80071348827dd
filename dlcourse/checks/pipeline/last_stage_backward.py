"""Lesson 06's exercise 3: the last stage's loss, scaled over the micro-batches, run as 1F1B
through the check's executor (the set's guide is `__init__.py`)."""

from functools import partial

import torch

from dlcourse.checks.core import expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.in_rank import loss_in_rank
from dlcourse.checks.pipeline.schedule_1f1b import RUN_TIMEOUT_S, _chain, one_f_one_b
from dlcourse.checks.pipeline.stages import expect_stage_grads, join, whole_batch


# ---------------------------------------------------------------- exercise 3: the loss, scaled

LOSS_HINT = ("x arrives without a graph: x.requires_grad_(); loss = loss_fn(stage(x), target) "
             "/ n_micro; loss.backward(); return x.grad")


@fresh_cases
def check_last_stage_backward(last_stage_backward, timeout=RUN_TIMEOUT_S, *, rng):
    """last_stage_backward(stage, x, target, loss_fn, n_micro) -> the gradient of x to send back,
    called by the last of p real stages for each micro-batch: every stage's gradients must add up
    to the whole batch's."""
    __tracebackhide__ = True
    expect_callable(last_stage_backward, "last_stage_backward")
    ps = rng.sample([2, 3, 4, 5], 2)
    for p in ps:
        chain, m = _chain(rng, p), rng.randint(2, 6)
        b = rng.choice([k for k in range(1, 5) if k != m])  # dividing by b must not pass
        where = (f"last_stage_backward on {p} stages, {m} micro-batches of {b} samples, "
                 "F.mse_loss")
        outcomes = run_on_ranks(last_stage_backward,  # each rank its own 1F1B list, made here
                                [(chain, m, b, one_f_one_b(r, p, m)) for r in range(p)],
                                exercise="last_stage_backward", where=where, hint=LOSS_HINT,
                                harness=loss_in_rank, guard=ANSWERS.in_rank,
                                timeout=timeout)
        _expect_loss_case(outcomes, chain, m, b, where)
    print(f"last_stage_backward: passed on {len(ps)} cases drawn at random ({join(ps)} stages, "
          "2 to 6 micro-batches), every stage's gradients equal to one process on the whole batch")


def _expect_loss_case(outcomes, chain, m, b, where):
    __tracebackhide__ = True
    p = chain.n_stages
    for rank, ((_, returned), _) in enumerate(outcomes):
        bad = next(((i, r) for i, r in enumerate(returned) if r), None)
        if bad:
            fail(where, rank, f"{bad[1]} (micro-batch {bad[0]})", LOSS_HINT)
    expected = whole_batch(chain, chain.batch(m, b))
    for rank in [p - 1, *range(p - 1)]:  # the last stage's own gradients say the most
        grads = outcomes[rank][0][0]
        expect_stage_grads(grads, expected[rank], where=where, rank=rank,
                           explain=partial(_loss_hint, grads, expected[rank], m, rank, p))


def _loss_hint(got, expected, m, rank, p):
    scale = _scale(got, expected)
    if scale is not None and abs(scale - m) < 1e-6 and rank < p - 1:
        return (f"the last stage's gradients are right but rank {rank}'s are n_micro = {m} "
                "times the whole batch's: scale the loss before backward, so that x.grad, "
                "which goes back to the earlier stages, is scaled too")
    if scale is not None and abs(scale - m) < 1e-6:
        return (f"the gradients are n_micro = {m} times the whole batch's: each micro-batch's "
                "loss is a mean over its own samples; divide it by n_micro before backward")
    if scale is not None and abs(scale * m - 1) < 1e-6:
        return f"the gradients are 1/{m} of the whole batch's: divide the loss by n_micro once"
    return LOSS_HINT


def _scale(got, expected):
    """c if got == c x expected for one number c, else None."""
    if any(g is None for g in got):
        return None
    dot = sum(float((g * e).sum()) for g, e in zip(got, expected))
    norm = sum(float((e * e).sum()) for e in expected)
    c = dot / norm if norm else 0.0
    ok = all(torch.allclose(g, c * e, rtol=1e-6, atol=1e-9) for g, e in zip(got, expected))
    return c if ok else None
