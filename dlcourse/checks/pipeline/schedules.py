"""Lesson 06's 1F1B check, run on real stages (the set's guide is `__init__.py`; the loss
scaling, run the same way, is in `loss.py`).

A schedule is data: each rank's list of ("F", i) and ("B", i). The check plays every rank's list
against the others' before any process starts (`schedule_problem`): a micro-batch missing or run
twice, a backward before its forward, and a wait that never ends are named by rank and step.
Then the lists run on real ranks through the check's own executor (`stages.run_actions`), and
every stage's gradients must equal one process's on the whole batch. The reference 1F1B order
(`one_f_one_b`) is a rule: a rank runs forwards while it holds fewer than p - rank micro-batches,
else the oldest backward; tests/test_checks_schedule_1f1b.py holds it equal to a tick-by-tick
simulation of the pipeline.
"""

import numbers

import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, kind,
                                  run_on_ranks)
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.stages import (Chain, expect_stage_grads, join, run_actions,
                                             whole_batch)


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


def deadlock(schedules):
    """Play every rank's actions: a forward of i on rank r needs rank r - 1's forward of i, a
    backward of i needs rank r + 1's backward of i (sends never wait, receives do). None if all
    finish, else [(rank, step, action, what it waits for)] of every rank that is stuck."""
    p = len(schedules)
    done = [set() for _ in range(p)]
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while position[r] < len(schedules[r]):
                kind, i = schedules[r][position[r]]
                needs = (r - 1, "F") if kind == "F" else (r + 1, "B")
                if 0 <= needs[0] < p and (needs[1], i) not in done[needs[0]]:
                    break
                done[r].add((kind, i))
                position[r] += 1
                progress = True
    stuck = [(r, position[r], schedules[r][position[r]]) for r in range(p)
             if position[r] < len(schedules[r])]
    return [(r, step, action, _waits_for(r, action)) for r, step, action in stuck] or None


def _waits_for(rank, action):
    kind, i = action
    if kind == "F":
        return f"waits for rank {rank - 1}'s activation of micro-batch {i}"
    return f"waits for rank {rank + 1}'s gradient of micro-batch {i}"


def schedule_problem(schedules, n_micro):
    """(rank, problem, hint) of the first thing that stops these lists from running as a
    pipeline, or None: not a list of actions, a micro-batch missing or twice, a backward before
    its forward, a wait that never ends."""
    for rank, actions in enumerate(schedules):
        problem = _rank_problem(actions, n_micro)
        if problem:
            return (rank, *problem)
    stuck = deadlock(schedules)
    if stuck:
        waits = "; ".join(f"rank {r} at actions[{step}] = {action} {what}"
                          for r, step, action, what in stuck)
        return (stuck[0][0], f"waits forever (deadlock): {waits}",
                "a stage can only run the forward of i after the previous stage did, and the "
                "backward of i after the next stage did: follow 1F1B's order on every rank")
    return None


WARM_UP_CAP = ("with fewer micro-batches than stages ahead, the warm-up runs out of them: it "
               "is min(p - rank - 1, n_micro) forwards, then the remaining backwards")


def _rank_problem(actions, n_micro):
    """(problem, hint) if one rank's list is not m forwards and m backwards, each forward before
    its backward."""
    form = 'a list of ("F", i) and ("B", i) pairs, i from 0 to n_micro - 1'
    if isinstance(actions, str) or any(a is None or a[0] not in ("F", "B") for a in actions):
        what = actions if isinstance(actions, str) else "an item that is not one"
        return f"returned {what}, expected {form}", "e.g. [('F', 0), ('F', 1), ('B', 0), ...]"
    seen = {}
    for step, action in enumerate(actions):
        what, i = action
        if not 0 <= i < n_micro:
            return (f"runs actions[{step}] = {action}, but micro-batches are 0 to {n_micro - 1}",
                    WARM_UP_CAP if what == "F" and i >= n_micro else form)
        if action in seen:
            return (f"runs {action} twice: actions[{seen[action]}] and actions[{step}]",
                    "each micro-batch's forward and backward run once per step")
        if what == "B" and ("F", i) not in seen:
            return (f"runs actions[{step}] = {action}, the backward of micro-batch {i}, before "
                    "its forward", "a backward needs the activations its forward saved: in the "
                    "steady state each step runs a forward (the newest), then a backward (the "
                    "oldest)")
        seen[action] = step
    missing = [(k, i) for k in "FB" for i in range(n_micro) if (k, i) not in seen]
    if missing:
        return (f"never runs {missing[0]} ({len(missing)} actions missing)",
                "every micro-batch needs its forward and its backward on every stage")
    return None


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
                            harness=_schedule_in_rank, guard=ANSWERS.in_rank, timeout=timeout)
    expected = whole_batch(chain, chain.batch(m, micro_size))
    for rank, (result, _) in enumerate(outcomes):
        if result["problem"]:
            at, problem, hint = result["problem"]
            fail(where, at, problem, hint)
        expect_stage_grads(result["grads"], expected[rank], where=where, rank=rank,
                           explain=lambda: SCHEDULE_HINT)
    for rank, (result, _) in enumerate(outcomes):
        _expect_1f1b(result["actions"], rank, p, m, where)


def _schedule_in_rank(student, chain, n_micro, micro_size):
    """Runs in every rank: the student's list for this rank, every rank's list played against
    the others' (the same verdict on every rank, so all run it or none), then run for real."""
    rank, p = dist.get_rank(), dist.get_world_size()
    actions = student(rank, p, n_micro)
    everyone = [None] * p
    dist.all_gather_object(everyone, _plain(actions))
    problem = schedule_problem(everyone, n_micro)
    if problem:
        return {"problem": problem, "actions": everyone[rank]}
    grads = run_actions(everyone[rank], chain.stage(rank), chain.batch(n_micro, micro_size),
                        n_micro)
    return {"problem": None, "actions": everyone[rank], "grads": grads}


def _plain(actions):
    """The student's list as [(kind, i)] if it has that form, else what it is, in words."""
    try:
        return [(str(k), int(i)) if isinstance(k, str) and isinstance(i, numbers.Integral)
                else None for k, i in actions]
    except (TypeError, ValueError):  # not iterable, or items that are not pairs
        items = list(actions) if isinstance(actions, (list, tuple)) else []
        return kind(actions) + (f" of items like {items[0]!r}" if items else "")


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
