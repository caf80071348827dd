"""What a resume needs, and what forgetting each piece does (lesson 11,
`lessons/11_checkpoints.ipynb`).

    state = resume_state(run)          # on every rank: its own pieces (TP shards, its RNG stream)
    restore(TrainRun(cfg, group), state)

    piece        what it holds                                  forgotten, the resumed run...
    model        this rank's parameters                         starts again from the initial weights
    optimizer    AdamW's m, v and step count                    takes a first Adam step (bias correction)
    scheduler    the LR schedule's step                         warms up again: a smaller step
    rng          torch's default generator state                draws other residual-dropout masks
    tracker      this rank's "tensor-parallel" stream (04)      draws other attention-dropout masks
    data         the data stream's (epoch, index)               trains on batches it has seen

`resume_divergences` runs the run twice on real ranks, once uninterrupted and once saved after k
steps and restored into a fresh run with some pieces forgotten, and hands both to lesson 10's
divergence finder (`debug.divergence.record`, `debug.compare.compare_trace`), which names the
first tensor where they part.
"""

import io
import re
import warnings

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.checkpoint.files import CheckpointError
from dlcourse.checkpoint.run import RunConfig, TrainRun
from dlcourse.debug.compare import compare_trace
from dlcourse.debug.divergence import Divergence, record
from dlcourse.debug.subjects import Subject

PIECES = ("model", "optimizer", "scheduler", "rng", "tracker", "data")


def resume_state(run):
    """Everything this rank needs to go on from where `run` is, as copies (tensors, numbers)."""
    return {
        "step": run.steps_done,
        "model": {k: v.detach().clone() for k, v in run.model.state_dict().items()},
        "optimizer": run.optimizer.state_dict(),  # references: torch.save copies them
        "scheduler": run.scheduler.state_dict(),
        "rng": torch.get_rng_state(),  # (5056,) uint8: the CPU generator's Mersenne twister
        "tracker": {name: s.clone() for name, s in run.tracker.states.items()},
        "data": run.data.state_dict(),
    }


def restore(run, state, forget=()):
    """Put `state` into a freshly started `run`, leaving out the pieces named in `forget`."""
    unknown = set(forget) - set(PIECES)
    if unknown:
        raise ValueError(f"forget names pieces of {PIECES}, got {sorted(unknown)}")
    missing = [p for p in PIECES if p not in state and p not in forget]
    if missing:
        raise CheckpointError(f"the resume state has no {', '.join(missing)}: save "
                              f"{', '.join(PIECES)} (resume_state)")
    if "model" not in forget:
        check_same_model(state["model"], run.model.state_dict())
        run.model.load_state_dict(state["model"])
    if "optimizer" not in forget:
        run.optimizer.load_state_dict(state["optimizer"])
    if "scheduler" not in forget:
        run.scheduler.load_state_dict(state["scheduler"])
    if "rng" not in forget:
        torch.set_rng_state(state["rng"])
    if "tracker" not in forget:
        run.tracker.states.update({k: v.clone() for k, v in state["tracker"].items()})
    if "data" not in forget:
        run.data.load_state_dict(state["data"])
    run.steps_done = int(state["step"])
    return run


def check_same_model(saved, model):
    """CheckpointError naming the first tensor whose name or shape differs between a saved state
    dict and the model's (a checkpoint of another model, or another layout)."""
    only_saved = [k for k in saved if k not in model]
    only_model = [k for k in model if k not in saved]
    if only_saved or only_model:
        name, where = (only_saved[0], "the checkpoint") if only_saved else (only_model[0], "the model")
        raise CheckpointError(f"checkpoint from another model: {name} is only in {where} "
                              f"({len(only_saved)} names only saved, {len(only_model)} only in "
                              "the model)")
    for k, v in saved.items():
        if tuple(v.shape) != tuple(model[k].shape):
            raise CheckpointError(f"checkpoint from another model or layout: {k} is "
                                  f"{tuple(v.shape)} in the checkpoint, {tuple(model[k].shape)} "
                                  "in the model")


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


def trained(cfg, k):
    """A fresh run on every rank of the world, trained k steps."""
    run = TrainRun(cfg, dist.group.WORLD)
    for _ in range(k):
        run.step()
    return run


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


def through_bytes(state):
    """`state` saved with torch.save and loaded back (weights_only), as from a file."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


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


__all__ = ["PIECES", "RunConfig", "TraceConfig", "check_same_model", "compare_resumes",
           "compare_runs", "first_divergence", "record_run", "restore", "resume_divergences",
           "resume_state", "subject_of", "through_bytes", "trained"]
