"""Lesson 06, exercise 1 (`exercises/06_pipeline.ipynb`): `check_stage_boundaries`, balanced
stages with the last never among the larger, a formula called here (graded: every case in one
launch).
"""

import numbers

import torch

from dlcourse.checks.core import call_each_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.pipeline.answers import ANSWERS
from dlcourse.checks.pipeline.stages import join, stage_counts


BOUNDARY_HINT = ("stage s holds n_layers // n_stages blocks, and n_layers % n_stages stages "
                 "one more; the boundaries are the running sums of those sizes, from 0 to "
                 "n_layers")
LAST_STAGE_HINT = ("the last stage also runs the output layer and the loss (lesson 06 measures "
                   "it slower): give the n_layers % n_stages extra blocks to other stages, the "
                   "first ones or, as Llama 3 does, the middle ones")


@fresh_cases
def check_stage_boundaries(stage_boundaries, *, rng):
    """stage_boundaries(n_layers, n_stages) -> [b_0 = 0, b_1, ..., b_p = n_layers]: stage s holds
    blocks b_s to b_{s+1} - 1, sizes differing by at most one (the blocks cost alike), and the
    last stage, which also runs the output layer and the loss, not among the larger ones. Where
    the extra blocks go otherwise is the student's choice: first stages, middle ones."""
    __tracebackhide__ = True
    expect_callable(stage_boundaries, "stage_boundaries")
    cases = [(p * rng.randint(1, 4) + (rng.randint(1, p - 1) if i % 2 else 0), p)
             for i, p in enumerate(stage_counts(rng, 6))]
    calls = [((n, p), f"stage_boundaries(n_layers={n}, n_stages={p})") for n, p in cases]
    answers = call_each_in_process(stage_boundaries, calls, exercise="stage_boundaries",
                                   guard=ANSWERS.in_process)  # graded: every case in one launch
    for (n, p), (_, where), got in zip(cases, calls, answers):
        _expect_boundaries(got, n, p, where)
    stages = join(sorted({p for _, p in cases}))
    print(f"stage_boundaries: passed on {len(cases)} cases drawn at random ({stages} "
          "stages; even and uneven splits): balanced, the last stage never one of the larger")


def _expect_boundaries(got, n, p, where):
    __tracebackhide__ = True
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]  # torch's split: extras first
    if not isinstance(got, (list, tuple)) or not all(
            isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in got):
        fail(where, None, f"returned {kind(got)}, expected a list of {p + 1} whole numbers",
             BOUNDARY_HINT)
    if len(got) != p + 1:
        fail(where, None, f"returned {len(got)} boundaries, expected n_stages + 1 = {p + 1}: "
                          "stage s holds the blocks from b[s] up to b[s + 1] - 1", BOUNDARY_HINT)
    if got[0] != 0 or got[-1] != n:
        fail(where, None, f"returned {list(got)}, which must start at 0 and end at "
                          f"n_layers = {n}, so that every block is on one stage", BOUNDARY_HINT)
    held = [b - a for a, b in zip(got, got[1:])]
    if min(held) < 1:
        s = held.index(min(held))
        fail(where, None, f"returned {list(got)}: stage {s} holds {held[s]} blocks",
             "boundaries only grow, and every stage holds at least one block")
    if max(held) - min(held) > 1:
        fail(where, None, f"returned {list(got)}: stages hold {join(held)} blocks, not "
                          f"balanced (a stage waits for the slowest, {max(held)} blocks)",
             f"{n} blocks on {p} stages: n_layers // n_stages = {n // p} each, one more on "
             f"n_layers % n_stages = {n % p} of them, e.g. the first: sizes {join(sizes)}")
    if held[-1] > min(held):
        fail(where, None, f"returned {list(got)}: stages hold {join(held)} blocks; balanced, "
                          f"but the last stage holds one of the extra blocks and also runs "
                          f"the output layer and the loss: it is the slowest stage",
             LAST_STAGE_HINT)
