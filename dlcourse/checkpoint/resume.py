"""What a resume needs, and what forgetting each piece would do (lesson 11,
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

What forgetting each piece does, named by lesson 10's divergence finder: `debug/forgetting.py`.
"""

import torch

from dlcourse.checkpoint.files import CheckpointError
from dlcourse.checkpoint.run import RunConfig

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


__all__ = ["PIECES", "RunConfig", "check_same_model", "restore", "resume_state"]
