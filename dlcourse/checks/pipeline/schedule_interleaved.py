"""Lesson 06's check of an interleaved 1F1B action list (the package's `__init__.py` re-exports it):

    check_schedule_interleaved(schedule_interleaved)   one rank's list, v chunks per rank

Rank r of p holds v chunks of the model; chunk c is model stage c * p + r (Narayanan et al.
2021, §2.2.2). The student's function, called on each of p real ranks for its own rank, returns
[(kind, chunk, i)]. The lists come back as data, and here, after no student code runs any more:
1. each list is read as a schedule: every forward and backward of every chunk and micro-batch
   once, a backward after its own forward, and the p lists played together until all finish
   (a wait that never ends is named by rank, step and what it waits for);
2. the lesson's own simulator (`measure.simulate`, forward 1, backward 2, a chunk's action 1/v
   of a stage's) times them: the bubble must be the interleaved formula, (p - 1) / (v m + p - 1)
   of the step, and each rank's peak of chunk activations held at once (`measure.in_flight_peak`)
   at most min(v m, 2 (p - r - 1) + (v - 1) p + 1), the warm-up's forwards and one more.
Both formulas were held equal to the library's `interleaved_1f1b` under the simulator for
p = 2..5, v = 2, 3, m = p, 2p, 3p (tests/test_checks_schedule_interleaved.py keeps a few).
While the student's code runs, the library's pipeline package and torch's schedules are refused
(`stages.refuse_pipelines`), and so is every function of this module, the check's references.
"""


from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases,
                                  run_on_ranks)
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.in_rank import interleaved_in_rank
from dlcourse.parallel.pipeline.measure import bubble_fraction, in_flight_peak, simulate
from dlcourse.parallel.pipeline.schedules import Action

RUN_TIMEOUT_S = 3 * CHECK_TIMEOUT_S  # up to 5 ranks on a loaded machine (see schedule_1f1b.py)
# the simulator adds unit lengths divided by v (2 or 3): float rounding of a sum of a few
# hundred such terms, ~1e-14; a wrong schedule moves the bubble by at least 1/(v m + p - 1)^2
BUBBLE_TOL = 1e-9

ORDER_HINT = ("forwards go through the chunks in groups of p micro-batches (chunk 0 for "
              "micro-batches 0..p-1, then chunk 1 for the same ones, ...), backwards the same "
              "groups with the chunks from last to first; then 1F1B over those two sequences")


def expected_warm_up(rank, p, m, v):
    """Megatron-LM's interleaved warm-up: 2 (p - rank - 1) + (v - 1) p forwards, at most v m."""
    return min(2 * (p - rank - 1) + (v - 1) * p, v * m)


def expected_peak(rank, p, m, v):
    """The most chunk activations rank `rank` holds: its warm-up and one more forward."""
    return min(v * m, expected_warm_up(rank, p, m, v) + 1)


def expected_bubble(p, m, v):
    """Interleaved 1F1B's idle share of the step (Narayanan et al. 2021: (p-1)/(v m) of the
    ideal time, so (p-1)/(v m + p-1) of the step)."""
    return (p - 1) / (v * m + p - 1)


# ---------------------------------------------------------------- the check


@fresh_cases
def check_schedule_interleaved(schedule_interleaved, timeout=RUN_TIMEOUT_S, *, rng):
    """schedule_interleaved(rank, n_stages, n_micro, v) -> this rank's [(kind, chunk, i)] on
    n_stages = p ranks of v chunks each: a schedule that finishes, with interleaved 1F1B's bubble
    and at most its activations in flight."""
    __tracebackhide__ = True
    expect_callable(schedule_interleaved, "schedule_interleaved")
    cases = draw_cases(rng)
    for p, m, v in cases:
        where = f"schedule_interleaved with n_stages = {p}, n_micro = {m}, v = {v}"
        outcomes = run_on_ranks(schedule_interleaved, [(m, v)] * p,
                                exercise="schedule_interleaved", where=where, hint=ORDER_HINT,
                                harness=interleaved_in_rank, guard=ANSWERS.in_rank,
                                timeout=timeout)
        expect_interleaved([value for value, _ in outcomes], p, m, v, where)
    print(f"schedule_interleaved: passed on {len(cases)} cases drawn at random ("
          + "; ".join(f"p = {p}, m = {m}, v = {v}" for p, m, v in cases)
          + "): every list runs, the simulated bubble is (p - 1)/(v m + p - 1) of the step, "
          "and no rank holds more chunk activations at once than interleaved 1F1B")


def draw_cases(rng):
    """(p, m, v), m a multiple of p, each p of 2, 3, 4 once, v 2 or 3: one case with m = p (the
    first ranks' warm-up capped at v m), two with m = 2p or 3p (a steady state on every rank)."""
    ps = rng.sample([2, 3, 4], 3)
    return [(p, p * (1 if k == 0 else rng.choice([2, 3])), rng.choice([2, 3]))
            for k, p in enumerate(ps)]


# ---------------------------------------------------------------- the verdict


def expect_interleaved(lists, p, m, v, where):
    """Fail with the first problem of these p lists, each rank's [(kind, chunk, i)]."""
    __tracebackhide__ = True
    for rank, actions in enumerate(lists):
        problem = rank_problem(actions, m, v)
        if problem and problem[0].endswith("before its forward") \
                and _warm_up(actions) < expected_peak(rank, p, m, v):
            problem = (problem[0], _warm_up_hint(actions, rank, p, m, v))
        if problem:
            fail(where, rank, *problem)
    stuck = deadlock(lists, p, v)
    if stuck:
        fail(where, stuck[0][0], "waits forever (deadlock): " + "; ".join(
            f"rank {r} at actions[{step}] = {a} waits for {what}" for r, step, a, what in stuck),
            "a chunk's forward of i needs the previous model stage's forward of i (chunk c of "
            "rank r follows chunk c of rank r - 1, and chunk c of rank 0 follows chunk c - 1 of "
            "rank p - 1); its backward needs the next stage's backward. " + ORDER_HINT)
    by_rank = {r: [Action(c * p + r, k, i) for k, c, i in acts] for r, acts in enumerate(lists)}
    for rank, actions in by_rank.items():
        peak, most = in_flight_peak(actions), expected_peak(rank, p, m, v)
        if peak > most:
            fail(where, rank, f"holds {peak} chunk activations at once; interleaved 1F1B holds "
                              f"at most {most} here", _warm_up_hint(lists[rank], rank, p, m, v))
    got, expected = bubble_fraction(simulate(by_rank)), expected_bubble(p, m, v)
    if abs(got - expected) > BUBBLE_TOL:
        slow = next((r for r in range(p) if _warm_up(lists[r]) != expected_peak(r, p, m, v)),
                    None)
        hint = ORDER_HINT if slow is None else _warm_up_hint(lists[slow], slow, p, m, v)
        fail(where, slow, f"runs, but its simulated bubble is {got:.4f} of the step, interleaved "
                          f"1F1B's is (p - 1)/(v m + p - 1) = {expected:.4f}", hint)


def rank_problem(actions, m, v):
    """(problem, hint) if one rank's list is not every (F|B, chunk, i) once, F before B."""
    form = f'a list of (kind, chunk, i): kind "F" or "B", chunk 0..{v - 1}, i 0..{m - 1}'
    if isinstance(actions, str):
        return f"returned {actions}, expected {form}", "e.g. [('F', 0, 0), ('F', 0, 1), ...]"
    seen = {}
    for step, action in enumerate(actions):
        if action is None or action[0] not in ("F", "B") or not 0 <= action[1] < v \
                or not 0 <= action[2] < m:
            return f"has actions[{step}] = {action}, not an action", form
        if action in seen:
            return (f"runs {action} twice: actions[{seen[action]}] and actions[{step}]",
                    "each chunk runs each micro-batch's forward and backward once per step")
        if action[0] == "B" and ("F", *action[1:]) not in seen:
            return (f"runs actions[{step}] = {action} before its forward",
                    "a backward needs the activations its forward saved, on the same chunk; "
                    + ORDER_HINT)
        seen[action] = step
    missing = [(k, c, i) for k in "FB" for c in range(v) for i in range(m)
               if (k, c, i) not in seen]
    if missing:
        return (f"never runs {missing[0]} ({len(missing)} actions missing)",
                "every micro-batch goes forward and backward through each of the rank's v chunks")
    return None


def deadlock(lists, p, v):
    """Play the lists: F of chunk c, i on rank r needs model stage s - 1's F of i (s = c p + r),
    B needs stage s + 1's B. None if all finish, else [(rank, step, action, what it waits for)]."""
    done, position, n = set(), [0] * p, v * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while position[r] < len(lists[r]):
                k, c, i = lists[r][position[r]]
                need = _needs(k, c * p + r, i, n)
                if need and need not in done:
                    break
                done.add((k, c * p + r, i))
                position[r] += 1
                progress = True
    stuck = [(r, position[r], lists[r][position[r]]) for r in range(p)
             if position[r] < len(lists[r])]
    return [(r, step, a, _what(_needs(a[0], a[1] * p + r, a[2], n), p)) for r, step, a in stuck]


def _needs(k, s, i, n):
    if k == "F":
        return ("F", s - 1, i) if s > 0 else None
    return ("B", s + 1, i) if s < n - 1 else None


def _what(need, p):
    k, s, i = need
    return (f"rank {s % p}'s {'forward' if k == 'F' else 'backward'} of micro-batch {i} on "
            f"its chunk {s // p}")


def _warm_up(actions):
    """The forwards before the first backward: the warm-up and the steady state's first."""
    return next((k for k, a in enumerate(actions) if a[0] == "B"), len(actions))


def _warm_up_hint(actions, rank, p, m, v):
    got, want = _warm_up(actions), expected_peak(rank, p, m, v)
    if got == want:
        return ORDER_HINT
    return (f"warm-up too {'long' if got > want else 'short'}: rank {rank} runs {got} forwards "
            f"before its first backward, interleaved 1F1B runs {want} here (its warm-up and the "
            "steady state's first forward): enough to fill the ranks after it and the chunks "
            "after the first, at most v m; then each backward comes after a forward")
