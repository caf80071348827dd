"""Lesson 06's 1F1B check, run on real stages (the set's guide is `__init__.py`; the loss
scaling, run the same way, is in `last_stage_backward.py`).

A schedule is data: each rank's list of ("F", i) and ("B", i). The check plays every rank's list
against the others' before any process starts (`schedule_problem`): a micro-batch missing or run
twice, a backward before its forward, and a wait that never ends are named by rank and step.
Then the lists run on real ranks through the check's own executor (`in_rank.run_actions`), and
every stage's gradients must equal one process's on the whole batch. The reference 1F1B order
(`one_f_one_b`) is a rule: a rank runs forwards while it holds fewer than p - rank micro-batches,
else the oldest backward; tests/test_checks_schedule_1f1b.py holds it equal to a tick-by-tick
simulation of the pipeline.
"""

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.in_rank import Chain, schedule_in_rank
from dlcourse.checks.pipeline.stages import expect_stage_grads, join, whole_batch


# ---------------------------------------------------------------- schedules as data


def one_f_one_b(rank, n_stages, n_micro):
    """The reference 1F1B order of `rank`: forward while fewer than p - rank micro-batches are in
    flight (and some remain), otherwise backward the oldest."""
    actions, forwarded, backwarded = [], 0, 0
    while backwarded < n_micro:
        if forwarded < n_micro and forwarded - backwarded < n_stages - rank:
            actions.append(("F", forwarded))
            forwarded += 1
        else:
            actions.append(("B", backwarded))
            backwarded += 1
    return actions


def in_flight_peak(actions):
    """The most micro-batches whose activations a rank holds at once, and the step it happens."""
    held, peak, at = 0, 0, 0
    for step, (what, _) in enumerate(actions):
        held += 1 if what == "F" else -1
        if held > peak:
            peak, at = held, step
    return peak, at


# ---------------------------------------------------------------- exercise 4: 1F1B, run

# A deadlock in a schedule is found by playing it before any rank starts, and the executor is
# the check's own, so a launch only outlives CHECK_TIMEOUT_S on a machine too loaded to start 5
# ranks in time (seen with 2 cores shared by many jobs), or if the student's function loops.
RUN_TIMEOUT_S = 3 * CHECK_TIMEOUT_S

SCHEDULE_HINT = ("warm-up: min(p - rank - 1, m) forwards; steady state: m - warm-up times one "
                 "forward then one backward; cool-down: the remaining backwards, oldest first")


@fresh_cases
def check_schedule_1f1b(schedule_1f1b, timeout=RUN_TIMEOUT_S, *, rng):
    """schedule_1f1b(rank, n_stages, n_micro) -> this rank's actions [("F", i) or ("B", i)],
    run on p real stages: it must finish, give the whole batch's gradients, and be 1F1B."""
    __tracebackhide__ = True
    expect_callable(schedule_1f1b, "schedule_1f1b")
    ps = rng.sample([2, 3, 4, 5], 3)  # p = 4 at most once
    ps.append(ps.pop(ps.index(max(ps))))  # the largest, 4 or 5, last:
    # fewer micro-batches than p - 1 there, so rank 0's warm-up must stop at m
    ms = [rng.randint(p, 2 * p + 2) for p in ps[:2]] + [rng.randint(1, ps[2] - 2)]
    for p, m in zip(ps, ms):
        chain = _chain(rng, p)
        _check_schedule_case(schedule_1f1b, chain, m, rng.randint(1, 3), timeout)
    print(f"schedule_1f1b: passed on {len(ps)} cases drawn at random ({join(ps)} stages; "
          f"{join(ms)} micro-batches), run on real ranks: no deadlock, every stage's gradients "
          "equal to one process on the whole batch, the 1F1B order")


def _chain(rng, p):
    """p stages of 1 or 2 layers each, width 3 to 6, a fresh seed."""
    bounds = [0]
    for _ in range(p):
        bounds.append(bounds[-1] + rng.randint(1, 2))
    return Chain(d=rng.randint(3, 6), bounds=bounds, seed=rng.randrange(10**6))


def _check_schedule_case(schedule_1f1b, chain, m, micro_size, timeout):
    __tracebackhide__ = True
    p = chain.n_stages
    where = f"schedule_1f1b with n_stages = {p}, n_micro = {m}"
    outcomes = run_on_ranks(schedule_1f1b, [(chain, m, micro_size)] * p,
                            exercise="schedule_1f1b", where=where, hint=SCHEDULE_HINT,
                            harness=schedule_in_rank, guard=ANSWERS.in_rank, timeout=timeout)
    expected = whole_batch(chain, chain.batch(m, micro_size))
    for rank, (result, _) in enumerate(outcomes):
        if result["problem"]:
            at, problem, hint = result["problem"]
            fail(where, at, problem, hint)
        expect_stage_grads(result["grads"], expected[rank], where=where, rank=rank,
                           explain=lambda: SCHEDULE_HINT)
    for rank, (result, _) in enumerate(outcomes):
        _expect_1f1b(result["actions"], rank, p, m, where)


def _expect_1f1b(actions, rank, p, m, where):
    __tracebackhide__ = True
    reference = one_f_one_b(rank, p, m)
    if actions == reference:
        return
    peak, at = in_flight_peak(actions)
    if peak > p - rank:
        fail(where, rank, f"holds {peak} micro-batches' activations at once (after actions[{at}]"
                          f" = {actions[at]}); 1F1B holds at most p - rank = {p - rank} here",
             f"the warm-up is p - rank - 1 = {p - rank - 1} forwards (at most m), not "
             f"{_warm_up(actions)}: then every forward is followed by a backward")
    step = next(k for k, (a, b) in enumerate(zip(actions, reference)) if a != b)
    fail(where, rank, f"runs actions[{step}] = {actions[step]}, 1F1B runs {reference[step]} "
                      f"there (it ran, but it is not 1F1B: {join(actions)})", SCHEDULE_HINT)


def _warm_up(actions):
    return next((k for k, (what, _) in enumerate(actions) if what == "B"), len(actions)) - 1
