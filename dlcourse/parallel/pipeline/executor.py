"""One executor for every schedule (lesson 06, `lessons/06_pipeline.ipynb`).

`run_schedule` walks a rank's action list (`schedules.py`) in order: F receives the input from
the previous stage (or reads the tokens), runs the stage and posts its output to the next stage
(or computes the loss); B receives the output's gradient, runs backward and posts the input's
gradient back; W, in zero-bubble schedules, runs the weight-gradient part that B left out. Every
action's start and end go on a `Timeline` (lesson 03's), for the measured schedule plot.

The loss of each micro-batch is divided by m, so the gradients summed over the m backwards are
the gradients of the whole batch's mean loss: what one process gets from the uncut model.

    micro = split_micro_batches(x, y, n_micro=8)
    loss = train_step(stages, optimizer, schedules.one_f_one_b, micro, group)
"""

import time

import torch
import torch.distributed as dist

from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from dlcourse.collectives.p2p import rank_in
from dlcourse.models import lm_loss
from dlcourse.parallel.pipeline import p2p
from dlcourse.parallel.pipeline.stages import sync_tied_grads

UNITS = {"F": 1, "B": 2, "W": 1, "B split": 1}  # a held action's length in units of `unit`


def split_micro_batches(x, y, n_micro):
    """[(x_i, y_i)]: the batch (B, T) cut into n_micro micro-batches (B/m, T), views of it
    (contiguous: the cut is along dim 0). No copy: a pipeline holds the batch once, and lesson
    01's saved-tensor accounting that leaves out the batch leaves out its micro-batches too."""
    if x.shape[0] % n_micro:
        raise ValueError(f"n_micro {n_micro} does not divide the batch of {x.shape[0]} sequences; "
                         f"pick a divisor of {x.shape[0]}")
    return list(zip(x.chunk(n_micro), y.chunk(n_micro)))


class Executor:
    """Runs one rank's actions for one step. `stages`: this rank's Stage modules; `unit`: if
    given, every action is held to UNITS[kind] x unit / v seconds (sleeping after its compute;
    v = the chunks this rank holds, each 1/v of a stage's work), so that the timeline shows the
    schedule itself, not the load of a shared machine."""

    def __init__(self, stages, micro_batches, group=None, timeline=None, unit=None):
        self.stages = {s.index: s for s in stages}
        self.micro, self.group, self.timeline, self.unit = micro_batches, group, timeline, unit
        self.n_micro, self.n_stages = len(micro_batches), stages[0].n_stages
        self.inputs, self.outputs, self.grads = {}, {}, {}  # (stage, mb) -> tensor
        self.sends, self.losses = [], []

    def run(self, actions):
        self.split = any(a.kind == "W" for a in actions)  # zero-bubble: B leaves W for later
        for action in actions:
            getattr(self, action.kind)(self.stages[action.stage], action.mb)
        for work in self.sends:  # everything posted has been received before the step ends
            work.wait()
        return sum(self.losses) if self.losses else None

    def F(self, stage, mb):
        x, y = self.micro[mb]
        if not stage.is_first:
            x = p2p.recv_activation((*x.shape, stage.hidden), _dtype(stage), stage.index, mb,
                                    self.n_stages, self.group).requires_grad_()
        with self._timed(stage, "F", mb):
            out = stage(x)  # (b, T, h), or logits (b, T, V) on the last stage
            if stage.is_last:
                out = lm_loss(out, y) / self.n_micro  # the m micro-batch losses sum to the mean
                self.losses.append(out.item())
        if not stage.is_last:
            self.sends.append(p2p.send_activation(out, stage.index, mb, self.n_stages, self.group))
        self.inputs[stage.index, mb], self.outputs[stage.index, mb] = x, out

    def B(self, stage, mb):
        key = (stage.index, mb)
        out = self.outputs[key]
        dy = None if stage.is_last else p2p.recv_gradient(out, stage.index, mb, self.n_stages,
                                                         self.group)
        x = self.inputs[key]
        with self._timed(stage, "B split" if self.split else "B", mb):
            if not self.split:
                torch.autograd.backward(out, dy)  # input and weight gradients at once
            elif not stage.is_first:  # input gradient only; note where W starts from
                self.grads[key] = input_gradient(out, dy, x, stage)
        if not stage.is_first:
            self.sends.append(p2p.send_gradient(x.grad, stage.index, mb, self.n_stages, self.group))
        if self.split and stage.is_first:
            self.grads[key] = dy  # no input gradient to send: W runs the whole backward
        if not self.split:
            del self.inputs[key], self.outputs[key]  # its saved activations are freed already

    def W(self, stage, mb):
        key = (stage.index, mb)
        with self._timed(stage, "W", mb):
            weights = [p for p in stage.parameters() if p.requires_grad]
            if stage.is_first:  # B did nothing (the tokens need no gradient): all of it now
                torch.autograd.backward(self.outputs[key], self.grads.pop(key), inputs=weights)
            else:  # from the gradients B left at each weight's layer, not from the output again
                stage_backward_weight(iter(weights), self.grads.pop(key))
        del self.inputs[key], self.outputs[key]

    def _timed(self, stage, kind, mb):
        return _Held(self, stage, kind, mb)



def input_gradient(out, dy, x, stage):
    """Zero bubble's B: dL/dx only, into x.grad, with torch's own `stage_backward_input` (what
    its ZB schedules run). On the way it records the gradient reaching each layer whose weights
    hang off the path from x to the output (a Linear's output, ...), and W starts from those
    (`stage_backward_weight`) instead of walking the input-gradient path again. The output is
    detached: the graph above those layers can go. Returns the param groups W needs."""
    _, param_groups = stage_backward_input([out], None if dy is None else [dy], [x],
                                           iter(p for p in stage.parameters() if p.requires_grad))
    return param_groups


def _dtype(stage):
    return next(stage.parameters()).dtype


class _Held:
    """Times one action's compute (from after its input arrived) and, with a unit, pads it."""

    def __init__(self, executor, stage, kind, mb):
        self.ex, self.stage, self.kind, self.mb = executor, stage, kind, mb

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.ex.unit is not None:
            v = len(self.ex.stages)  # interleaved: v chunks of 1/v of a stage each
            end = self.start + UNITS[self.kind] * self.ex.unit / v
            time.sleep(max(0.0, end - time.perf_counter()))
        if self.ex.timeline is not None:
            name = f"{self.kind[0]}{self.mb}"  # "F3", "B3", "W3"
            self.ex.timeline.add(f"stage {self.stage.index}", name, self.start, time.perf_counter())


def run_schedule(stages, actions, micro_batches, group=None, timeline=None, unit=None):
    """Run `actions` (this rank's list) on `stages` (this rank's); gradients accumulate in the
    stages' .grad. Returns the step's loss on the rank of the last stage, None elsewhere."""
    return Executor(stages, micro_batches, group, timeline, unit).run(actions)


def train_step(stages, optimizer, schedule, micro_batches, group=None, v=1, dp_group=None,
               **run_kwargs):
    """One optimizer step of a pipeline: zero the gradients, run `schedule(rank, p, m[, v])`,
    average over `dp_group` if the pipeline is replicated (lesson 03), sum the tied embedding's
    two gradients, step. Returns the loss on the last stage's rank, None elsewhere."""
    rank, p = rank_in(group, "train_step")
    args = (rank, p, len(micro_batches)) + ((v,) if v > 1 else ())
    optimizer.zero_grad()
    loss = run_schedule(stages, schedule(*args), micro_batches, group, **run_kwargs)
    finish_gradients(stages, group, dp_group)
    optimizer.step()
    return loss


def finish_gradients(stages, group=None, dp_group=None):
    """After the schedule: average each gradient over the data-parallel replicas of this stage
    (if any), then give both copies of the tied embedding their summed gradient."""
    if dp_group is not None and dist.get_world_size(dp_group) > 1:
        for param in (q for s in stages for q in s.parameters()):
            dist.all_reduce(param.grad, group=dp_group)
            param.grad.div_(dist.get_world_size(dp_group))
    sync_tied_grads(stages, group)
