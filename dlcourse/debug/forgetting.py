"""What forgetting each piece of a resume does, named by lesson 10's divergence finder (lesson 11,
`lessons/11_checkpoints.ipynb`).

`resume_divergences` runs lesson 11's run twice on real ranks, once uninterrupted and once saved
after k steps and restored into a fresh run with some pieces forgotten (`resume.restore`), and
hands both to the finder (`debug.divergence.record`, `debug.compare.compare_trace`), which names
the first tensor where they part. It lives with the finder, not beside `checkpoint/resume.py`:
what a resume needs (which the tour's kill-and-resume row uses) sits below the catalogue of
strategies, and the finder, which reads that catalogue, above it.
"""

import re
import warnings

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.checkpoint.resume import restore, resume_state
from dlcourse.checkpoint.run import RunConfig, TrainRun, through_bytes, trained
from dlcourse.debug.compare import compare_trace
from dlcourse.debug.divergence import Divergence, record
from dlcourse.debug.subjects import Subject


def subject_of(run):
    """The run as lesson 10's finder sees a strategy (`debug.subjects.Subject`)."""
    rank, t = dist.get_rank(run.group), dist.get_world_size(run.group)
    return Subject([run.model], run.optimizer, lambda x, y: run.step(), run.full_parameters,
                   tp=(rank, t))


class TraceConfig:
    """What `record` and `compare_trace` read of a config: steps, and the batch's shape."""

    def __init__(self, cfg, steps):
        self.steps, self.global_batch, self.model = steps, cfg.batch, cfg.model


def record_run(run, n):
    """The finder's trace of `run`'s next n steps: parameters, then per step the activations,
    gradients and parameters after it (`debug.divergence.record`)."""
    warnings.filterwarnings("ignore", message=re.escape("Seems like `optimizer.step()` has been "
                                                        "overridden"))  # the finder wraps step
    x = torch.zeros(1)  # `record` hands (x, y) to train_step; the run reads its own data
    trace, _ = record(subject_of(run), TraceConfig(run.cfg, n), x, x)
    return trace


def compare_runs(reference, run, n):
    """(gaps, max |Δ| of the final parameters) of `run`'s next n steps against the trace
    `reference` of the run that never stopped."""
    trace = record_run(run, n)
    gaps, _ = compare_trace(reference, trace, [], subject_of(run), TraceConfig(run.cfg, n))
    final = max((a - b).abs().max().item()
                for a, b in zip(reference[-1][2].values(), trace[-1][2].values()))
    return gaps, final


def compare_resumes(cfg, k, n, forgets=((),)):
    """On every rank: for each tuple of pieces in `forgets`, (gaps, max |Δ| of the parameters
    after n more steps) between a run of k + n steps and one saved after k steps, restored into a
    fresh run without those pieces and run n more."""
    reference = record_run(trained(cfg, k), n)
    results = []
    for forget in forgets:
        state = through_bytes(resume_state(trained(cfg, k)))  # what a file would give back
        resumed = restore(TrainRun(cfg, dist.group.WORLD), state, forget)  # a fresh start
        results.append(compare_runs(reference, resumed, n))
    return results


def first_divergence(per_rank, k):
    """The earliest gap over every rank's gaps (one resume's), as lesson 10's `Divergence`; its
    step counts from the start of the run (k + 1: the first resumed step). None: no gap."""
    gaps = [(g, rank) for rank, rank_gaps in enumerate(per_rank) for g in rank_gaps]
    if not gaps:
        return None
    where = min(g["position"] for g, _ in gaps)
    here = [(g, rank) for g, rank in gaps if g["position"] == where]
    g0 = here[0][0]
    step, phase = g0["step"] + k, g0["phase"]
    if g0["step"] == 0:  # the finder's "before step 1" is the first resumed step's
        step, phase = k + 1, "parameters before the step"
    return Divergence(step, phase, g0["name"], max(g["diff"] for g, _ in here),
                      max(g["scale"] for g, _ in here), sorted(rank for _, rank in here))


def resume_divergences(forgets, cfg=None, k=3, n=2, world_size=2, timeout=120):
    """[(first Divergence or None, max |Δ| of the final parameters)] of resumes after k steps,
    each forgetting the pieces of one entry of `forgets`, against the uninterrupted run, over n
    more steps on `world_size` ranks: one job for all."""
    forgets = [tuple(f) for f in forgets]
    per_rank = dlcourse.launch(compare_resumes, cfg or RunConfig(), k, n, forgets,
                               world_size=world_size, timeout=timeout)
    return [(first_divergence([rank[i][0] for rank in per_rank], k),
             max(rank[i][1] for rank in per_rank)) for i in range(len(forgets))]


__all__ = ["TraceConfig", "compare_resumes", "compare_runs", "first_divergence", "record_run",
           "resume_divergences", "subject_of"]
