"""The runs lesson 10's divergence exercise hands the student (`exercises/10_debugging.ipynb`):
real traces of the course's strategies on 2 gloo ranks, each with one bug of the catalogue
switched on or none, recorded by the lesson's own finder (`dlcourse/debug/divergence.py`,
`record`) beside the one-process reference; and the per-rank collective traces of lesson 10's
data-parallel job (`bugs.data_parallel_steps`, traced by `launch_traced`) that the hang exercise
breaks.

A rank's trace is given as the lesson compares it: the reference's activations cut to the piece
this rank holds (`compare._view`), the gradients in the order the reference's backward finished
them, and in both traces the same names, in the same order, so that position i of one is
position i of the other. Every bug and correct strategy runs once per process, in one launch
(`all_traces`); each check draws its cases among them.
"""

import functools
import tempfile
from dataclasses import replace

import dlcourse
from dlcourse.debug import SUBJECTS, launch_traced, read_traces
from dlcourse.debug.bugs import CATALOGUE, data_parallel_steps
from dlcourse.debug.compare import aligned
from dlcourse.debug.divergence import job, record_pair
from dlcourse.debug.subjects import DebugConfig

# 2-rank bugs that make a run part from the reference (not the slow one: no divergence)
BUGS = [name for name, bug in CATALOGUE.items()
        if SUBJECTS[bug.subject].world_size == 2 and name != "dp_sync_every_micro_batch"]
CORRECT = sorted({CATALOGUE[name].subject for name in BUGS})  # their strategies, bug-free


def traces_on_rank(jobs):
    """Runs on every rank: for each (strategy, bug or None), (reference trace, this rank's
    trace), aligned name by name (see the module's docstring)."""
    out = []
    for name, bug, cfg in jobs:
        ref_trace, order, subject, trace, _ = record_pair(name, bug, cfg)
        out.append(aligned(ref_trace, trace, order, subject, cfg))
    return out


JOBS = tuple([(CATALOGUE[name].subject, name) for name in BUGS]
             + [(name, None) for name in CORRECT])


@functools.lru_cache(maxsize=1)
def all_traces():
    """{(strategy, bug or None): [per rank: (reference, trace)]} of every job in JOBS: one
    launch (~5 s on 2 loaded cores) for a kernel's checks; the draws choose among them."""
    full = [job(name, bug) for name, bug in JOBS]
    per_rank = dlcourse.launch(traces_on_rank, full, world_size=2, backend="gloo", timeout=300)
    return {job: [per_rank[r][i] for r in range(2)] for i, job in enumerate(JOBS)}


@functools.lru_cache(maxsize=2)  # `seed=` replays a check's run without running it again
def traces_afresh(jobs, seed, timeout=120):
    """{(strategy, bug or None): [per rank: (reference, trace)]} of `jobs` (a tuple of (strategy,
    bug or None)) with the weights and data drawn from `seed`: one launch (~3 s for 4 jobs on 2
    loaded cores). Where a run first parts depends on the bug, not on the weights (the same
    place at the three seeds tried for every job), so `all_traces` tells which to draw and these are graded."""
    full = [job(name, bug, replace(DebugConfig(seed=seed), **SUBJECTS[name].config))
            for name, bug in jobs]
    per_rank = dlcourse.launch(traces_on_rank, full, world_size=2, backend="gloo",
                               timeout=timeout)
    return {jb: [per_rank[r][i] for r in range(2)] for i, jb in enumerate(jobs)}


@functools.lru_cache(maxsize=1)
def clean_calls(world_size=4):
    """{rank: [call dicts]} of 2 correct data-parallel SGD steps on `world_size` ranks, as
    `CommTrace` writes them (op, nbytes, group, peer, site): one all-reduce per parameter."""
    with tempfile.TemporaryDirectory(prefix="dlcourse-check-") as folder:
        launch_traced(data_parallel_steps, world_size=world_size, folder=folder, timeout=60,
                      backend="gloo")
        return read_traces(folder)
