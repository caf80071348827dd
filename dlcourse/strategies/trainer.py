"""The one object a catalogue entry builds (`Strategy.build(cfg, groups)` in `catalogue.py`): a
parallel trainer on one rank, as `dlcourse tour` times and measures it and as lesson 10's
divergence finder (`lessons/10_debugging.ipynb`) records it.

A `Trainer` trains a step on the global batch (each strategy takes its own part of it), reports
its state bytes and one step's communication and activations, and hands the finder its modules
(named as the plain GPT's, for the forward hooks), its optimizer (whose step the finder
intercepts to read the gradients) and its unshard helper (`full_parameters`).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import measure_model_state, peak_activations, storage_bytes


@dataclass
class Trainer:
    modules: list  # this rank's modules, named as the plain GPT's (a "module." prefix dropped)
    optimizer: object  # its step is intercepted by the finder: gradients are read just before it
    train_step: object  # fn(x, y) -> loss (None on a pipeline rank without the last stage)
    full_parameters: object  # fn() -> {name: whole tensor}: the strategy's unshard helper
    state_bytes: object = None  # fn() -> parameter + gradient + optimizer bytes on this rank
    #                             (None: lesson 01's count over `modules` and `optimizer`)
    count: object = None  # fn(trainer, x, y) -> (comm bytes, activation bytes or None) of one
    #                       step on a fresh trainer (None: `count_step`: every record's bus bytes)
    dp: tuple = (0, 1)  # (dp rank, dp size): rows of the global batch this rank's activations hold
    tp: tuple = (0, 1)  # (tp rank, tp size): an activation cut on dim 1 (SP) is this piece
    piece: object = None  # fn(reference activation) -> this rank's piece, or None: not comparable
    activations_from: int = 1  # the first step whose activations the finder compares
    model: object = None  # the module a step calls, where it wraps modules[0] (DP's wrapper)

    def held_bytes(self):
        if self.state_bytes is not None:
            return self.state_bytes()
        return held_bytes(nn.ModuleList(self.modules), self.optimizer)

    def counted(self, x, y):
        """(bytes this rank's collectives moved, most activation bytes held) in one step."""
        return (self.count or count_step)(self, x, y)


def count_step(trainer, x, y, sent=None, activations=True, run=None):
    """One step on the global batch under lesson 02's `CommCounter` and lesson 01's saved-tensor
    log (the batch x, y not counted): (round(bytes), peak activation bytes or None). `sent`:
    fn(counter) -> bytes, where the bus bytes of every record are not what the rank sends;
    `run`: fn() -> loss, the step itself, where it is not `trainer.train_step(x, y)`."""
    run = run or (lambda: trainer.train_step(x, y))
    peak = None
    with CommCounter() as comm:
        if activations:
            _, peak = peak_activations(nn.ModuleList(trainer.modules), run, ignore=(x, y))
        else:  # parameters lesson 01's log cannot key (DTensor, FSDP2, torch's ZeRO)
            run()
    return round(sent(comm) if sent else comm.bus_bytes()), peak


def held_bytes(model, optimizer):
    """Bytes of parameters, gradients and optimizer state this process holds (lesson 01)."""
    return measure_model_state(model, optimizer).model_state


def local_state_bytes(modules, optimizer):
    """Bytes of this rank's parameters, gradients and optimizer state, counted tensor by tensor
    (DTensors: their shards; several pipeline stages: summed)."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard
    params = [local(p) for m in modules for p in m.parameters()]
    tensors = params + [local(p.grad) for m in modules for p in m.parameters()
                        if p.grad is not None]
    tensors += [local(t) for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t)]
    return storage_bytes(tensors)


def cpu_params(model):
    """name -> a CPU copy of each parameter, for comparing with the reference."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.named_parameters()}


def replica_parameters(model):
    """A replicated model's own parameters, copied: every rank holds them whole."""
    return lambda: {n: p.detach().clone() for n, p in model.named_parameters()}


def mean_over_ranks(value, cfg):
    t = torch.tensor([float(value)], device=cfg.device())
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def mean_loss(loss, cfg):
    """The loss averaged over the ranks that computed one: `loss` is None on a pipeline rank
    without the last stage."""
    has = loss is not None
    return mean_over_ranks(loss if has else 0.0, cfg) / mean_over_ranks(float(has), cfg)


def rank_of(group):
    """(this rank's index in `group`, the group's size): a Trainer's dp or tp."""
    return dist.get_rank(group), dist.get_world_size(group)


@dataclass
class RowResult:
    """What a row of `dlcourse tour` reports for one strategy on one rank (the runner's,
    `tour/rows.py`, or an entry's `own_job`)."""

    loss: float  # loss of the last step
    params: dict  # name -> full parameter tensor after training (on CPU), for the comparison
    state_bytes: int  # parameters + gradients + optimizer state held by this rank
    comm_bytes: int | None  # bytes this rank's collectives moved per step; None if not counted
    step_time: float | None  # median seconds per step (None: not timed step by step)
    # the most activation bytes autograd held at once in one step (lesson 01's SavedTensorLog),
    # the batch not counted; None where the strategy's parameters are beyond that log
    activation_bytes: int | None = None
    # one process's parameters for a strategy that trains another model than the tour's GPT
    # (interleaved 1F1B's deeper GPT, the MoE GPT): compared with this instead of the reference's
    reference: dict | None = None
    note: str = ""  # what the table's columns cannot say (a row of its own job: restarts, launches)
