"""Check for lesson 10's fourth exercise (`exercises/10_debugging.ipynb`): a trainer with a bug of
the catalogue switched on, drawn at random, and the student names where it parts and which bug:

    check_name_the_bug(name_the_bug)   (first place, catalogue key) of a run with a drawn bug

Each run draws the model's weights and data (a seed), and four bugs among those of three
strategies (`STRATEGIES`), and records each buggy run beside one process on 2 gloo ranks, as
the first exercise's traces are (`runs.traces_on_rank`). Two of the four are always the twins:
`dp_grads_summed` and `uneven_batch_unweighted` on one strategy, with one config, part at the same
first place (the gradient of ln_f.weight, both ranks); so naming the bug by its strategy and
first place alone fails every run; a third is always `dp_no_broadcast`, which parts first on
rank 1 and whose ranks disagree, so reading one rank's traces fails every run too. What tells
them apart is what the gap looks like: the sum
is the world size times the average at every element, the unweighted uneven batch is no
multiple of it.

The student's function runs on a rank of its own, sent the case only: the strategy, its
candidate bugs, the tolerance and every rank's traces; not the key, the seed or the check's
frames. While it runs the lesson's tool (`find_divergence`, `compare_trace`, the catalogue's
`patch`) is refused (`answers.py`). The answer is computed after it returned: the place by the
lesson's comparison (`reference.first_gap`, the earliest over the ranks), the bug by the draw.
A key is read with its case and spaces forgiven: " DP grads-summed" is `dp_grads_summed`.
"""

import functools
from dataclasses import replace

import dlcourse
from dlcourse.checks.core import (CheckFailed, expect_callable, fail, fresh_cases, kind,
                                  run_on_ranks)
from dlcourse.checks.core.stubs import not_written, stub_message
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.checks.debug.first_divergence import _expect_place, _read
from dlcourse.checks.debug.in_rank import answer_as_data
from dlcourse.checks.debug.reference import first_gap
from dlcourse.checks.debug.runs import traces_on_rank
from dlcourse.debug.compare import TOLERANCE
from dlcourse.debug.divergence import PHASES, job
from dlcourse.debug.subjects import DebugConfig

# strategy -> the catalogue's bugs the check switches on in it: each strategy has two or three
# that part at different places or in a different way (lesson 10 shows each one's report)
STRATEGIES = {
    "DP overlapped (lesson 03)": ("dp_no_broadcast", "dp_grads_summed", "uneven_batch_unweighted"),
    "PP 1F1B (lesson 06)": ("pp_loss_not_divided", "pp_tied_embeddings_unsynced"),
    "TP (lesson 04)": ("tp_row_bias_per_rank", "tp_f_backward_not_summed"),
}
# One strategy's config for all its bugs: an uneven last batch (5 sequences on 2 ranks) in every
# DP run, so that the twins run with the same config and nothing but the gap tells them apart.
SHARED_CONFIG = {"DP overlapped (lesson 03)": dict(global_batch=5)}
TWINS = ("dp_grads_summed", "uneven_batch_unweighted")  # same strategy, same first place
# Parts first on rank 1 (its parameters differ before step 1, rank 0's at step 1) and its ranks
# disagree: an answer that reads rank 0's traces only, or one rank's, fails on every run.
RANKS_APART = ("dp_no_broadcast",)
WORLD_SIZE = 2
RUNS_TIMEOUT_S = 120  # 4 buggy runs and their references: ~2 s on 2 loaded cores
HINT = ("find the first place over every rank's traces (your first_divergence on each), then "
        "read what the gap there looks like: in which phase, on which ranks, and "
        "parallel / reference element by element")


@fresh_cases
def check_name_the_bug(name_the_bug, timeout=RUNS_TIMEOUT_S, *, rng):
    """name_the_bug(case) -> (place, bug): place (step, phase, name) the first tensor that
    differs on any rank, bug the catalogue key; `case` a dict: strategy, world_size,
    candidates, tolerance, traces {rank: (reference, parallel)}."""
    __tracebackhide__ = True
    expect_callable(name_the_bug, "name_the_bug")
    if stub_message(name_the_bug) is not None:  # a stub can only raise: say so, no run
        raise CheckFailed(not_written("name_the_bug", stub_message(name_the_bug)))
    drawn = draw_bugs(rng)
    seed = rng.randrange(10**6)
    traces = recorded(tuple(drawn), seed, timeout)
    for (strategy, bug), per_rank in zip(drawn, traces):
        case = dict(strategy=strategy, world_size=WORLD_SIZE, tolerance=TOLERANCE,
                    candidates=sorted(STRATEGIES[strategy]), traces=dict(enumerate(per_rank)))
        where = f"name_the_bug on a run of {strategy} with a bug of {case['candidates']}"
        [(got, _)] = run_on_ranks(name_the_bug, [(case,)], exercise="name_the_bug", where=where,
                                  hint=HINT, guard=ANSWERS.in_rank, harness=answer_as_data)
        _expect_answer(got, bug, case, where)
    print(f"name_the_bug: passed on {len(drawn)} runs with a bug drawn at random "
          f"({', '.join(b for _, b in drawn)}; weights and data drawn, 2 ranks, 2 steps, "
          "float64): each first place and each bug named, the twins that part at the same "
          "place told apart")


def draw_bugs(rng):
    """[(strategy, bug)]: both twins, the bug that parts on rank 1 first, one more, shuffled."""
    always = TWINS + RANKS_APART
    others = [(s, b) for s, bugs in STRATEGIES.items() for b in bugs if b not in always]
    drawn = [(s, b) for s, bugs in STRATEGIES.items() for b in bugs if b in always]
    drawn += rng.sample(others, 1)
    rng.shuffle(drawn)
    return drawn


@functools.lru_cache(maxsize=2)  # `seed=` replays a run without running it again
def recorded(drawn, seed, timeout):
    """[per case: [per rank: (reference, trace)]]: each run beside one process, on 2 ranks.
    `drawn` a tuple of (strategy, bug); every rank's traces reach the student's rank pickled,
    so the ones kept here are never changed."""
    jobs = [job(strategy, bug, replace(DebugConfig(seed=seed), **SHARED_CONFIG.get(strategy, {})))
            for strategy, bug in drawn]
    per_rank = dlcourse.launch(traces_on_rank, jobs, world_size=WORLD_SIZE, backend="gloo",
                               timeout=timeout)
    return [[per_rank[r][i] for r in range(WORLD_SIZE)] for i in range(len(jobs))]


def first_place(traces):
    """(rank, place) of the earliest first gap over the ranks, in the traces' order."""
    firsts = {r: first_gap(ref, mine) for r, (ref, mine) in traces.items()}
    ranked = [(_position(traces[r][0], p), r) for r, p in firsts.items() if p is not None]
    _, rank = min(ranked)
    return rank, firsts[rank], firsts


def _position(trace, place):
    step, phase, name = place
    i = next(i for i, (s, p, _) in enumerate(trace) if (s, p) == (step, phase))
    return i, list(trace[i][2]).index(name)


def key_of(value):
    """A catalogue key as the student may spell it: case, spaces and hyphens forgiven."""
    if not isinstance(value, str):
        return None
    return "_".join(value.strip().lower().replace("-", " ").split())


def _read_answer(got):
    """(place, bug) from a pair or a dict with 'place' and 'bug'; or None."""
    if isinstance(got, dict):
        got = (got.get("place"), got.get("bug"))
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return None
    return got[0], got[1]


def _expect_answer(got, bug, case, where):
    __tracebackhide__ = True
    answer = _read_answer(got)
    if answer is None:
        fail(where, None, f"returned {kind(got)} {got!r}, expected (place, bug): place "
                          f"(step, phase, name), bug a catalogue key such as "
                          f"{case['candidates'][0]!r}", HINT)
    place, named = answer
    rank, want, firsts = first_place(case["traces"])
    read = _read(place) if place is not None else None
    if read is not None and read in firsts.values() and read != want:
        other = next(r for r, p in firsts.items() if p == read)
        fail(where, None, f"returned {read}, rank {other}'s first place, but rank {rank} "
                          f"parts earlier: {want}",
             "a bug may show on some ranks only, or earlier on one: find each rank's first "
             "place and keep the earliest in the traces' order (step, then phase, then name)")
    _expect_place(place, want, *case["traces"][rank], where)
    if key_of(named) == bug:
        return
    if key_of(named) not in case["candidates"]:
        fail(where, None, f"named the bug {named!r}, which is not one of this run's candidates "
                          f"{case['candidates']}", "return the catalogue key of one candidate")
    twin = set(TWINS) == {key_of(named), bug}
    fail(where, None, f"named the bug {key_of(named)!r}, but this run's bug is another of "
                      f"{case['candidates']}, which parts first at the same place {want}"
         if twin else f"named the bug {key_of(named)!r}, but a run with it does not part "
                      f"this way: first at {want} on rank {rank}", _bug_hint(twin))


def _bug_hint(twin):
    if twin:
        return ("two bugs of this strategy part first at the same place: tell them apart by the "
                "gap itself; divide the parallel tensor by the reference's, element by element, "
                "and compare the quotient with the world size")
    return ("where a run parts says what broke: the parameters before step 1 (the start), an "
            f"activation (the forward), a gradient (backward or a reduction); phases {PHASES}. "
            "Read each candidate's CATALOGUE[key].breaks and ask which would part there")
