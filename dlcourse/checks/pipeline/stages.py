"""Running a lesson-06 exercise on pipeline stages: the pieces the checks of lesson 06
share.

- A pipeline the students never see: a chain of float64 `Linear + tanh` layers cut into stages
  (`Chain`), its micro-batches, and the reference: one process, the whole batch, `whole_batch`.
- `run_actions`: an executor of the check's own (not the library's) that runs a rank's action
  list on real ranks: an activation goes forward with `isend` and is received with a blocking
  `recv`, each message tagged with its micro-batch, so any order that
  `schedules.schedule_problem` passes runs.
- `stage_counts`: the numbers of stages a check draws, never p = 4 alone.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.core import fail


# ---------------------------------------------------------------- the pipeline and its reference


@dataclass
class Chain:
    """bounds[-1] float64 layers `tanh(x W^T + b)` of width d, cut at `bounds` (stage s holds
    layers bounds[s]:bounds[s+1]); every process builds the same weights from `seed`."""

    d: int
    bounds: list
    seed: int

    @property
    def n_stages(self):
        return len(self.bounds) - 1

    def layers(self, start, stop):
        out = []
        for i in range(start, stop):
            layer = torch.nn.Linear(self.d, self.d, dtype=torch.float64)
            generator = torch.Generator().manual_seed(self.seed + i)
            with torch.no_grad():  # weights ~ 1/sqrt(d): tanh stays away from saturation
                layer.weight.copy_(torch.randn(self.d, self.d, generator=generator,
                                               dtype=torch.float64) / self.d ** 0.5)
                layer.bias.copy_(0.1 * torch.randn(self.d, generator=generator,
                                                   dtype=torch.float64))
            out += [layer, torch.nn.Tanh()]
        return torch.nn.Sequential(*out)

    def stage(self, s):
        return self.layers(self.bounds[s], self.bounds[s + 1])

    def batch(self, n_micro, micro_size):
        """[(x, y)] of n_micro micro-batches, each (micro_size, d)."""
        generator = torch.Generator().manual_seed(self.seed + 1000)
        x = torch.randn(n_micro * micro_size, self.d, generator=generator, dtype=torch.float64)
        y = torch.randn(n_micro * micro_size, self.d, generator=generator, dtype=torch.float64)
        return list(zip(x.split(micro_size), y.split(micro_size)))


def stage_grads(stage):
    return [None if p.grad is None else p.grad.detach().clone() for p in stage.parameters()]


def whole_batch(chain, micro_batches):
    """One process: the gradient of the mean loss over the whole batch, per stage."""
    model = chain.layers(0, chain.bounds[-1])
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    F.mse_loss(model(x), y).backward()
    grads = stage_grads(model)  # 2 tensors (weight, bias) per layer, in order
    return [grads[2 * a:2 * b] for a, b in zip(chain.bounds, chain.bounds[1:])]


# float64 rounds ~1e-16; summing m micro-batches' gradients instead of one matmul over the batch
# moves a value by a few of those. 1e-10 allows 10^5 times that; the mistakes the checks name
# change a gradient by a factor (m, 1/m, p) or drop a micro-batch's part.
RTOL, ATOL = 1e-10, 1e-12

def expect_stage_grads(got, expected, *, where, rank, explain):
    """Fail unless this stage's gradients equal one process's on the whole batch."""
    __tracebackhide__ = True
    for k, (g, e) in enumerate(zip(got, expected)):
        name = f"layer {k // 2} {'weight' if k % 2 == 0 else 'bias'}"
        if g is None:
            fail(where, rank, f"has no gradient for its {name}", explain())
        wrong = ~torch.isclose(g, e, rtol=RTOL, atol=ATOL)
        if wrong.any():
            at = tuple(wrong.nonzero()[0].tolist())
            fail(where, rank, f"{name} gradient element {list(at)} is {g[at].item():.6g}, one "
                              f"process on the whole batch has {e[at].item():.6g} "
                              f"({int(wrong.sum())} of {wrong.numel()} differ)", explain())


# ---------------------------------------------------------------- drawing cases


def stage_counts(rng, n):
    """n values of p from 2 to 5, at least two of them not 4, in random order."""
    ps = rng.sample([2, 3, 5], 2) + [rng.randint(2, 5) for _ in range(n - 2)]
    rng.shuffle(ps)
    return ps


def join(items):
    return ", ".join(map(str, items))


# ---------------------------------------------------------------- the executor


def run_actions(actions, stage, micro_batches, n_micro, last_stage=None):
    """Run this rank's actions on real ranks (the default group, stage r on rank r) and return
    the stage's gradients. The last rank's loss is F.mse_loss / n_micro, or, in the loss-scaling
    exercise, `last_stage(stage, x, y)` runs forward and backward and returns x's gradient."""
    run = _StageRun(stage, micro_batches, n_micro, last_stage)
    for kind, i in actions:
        (run.forward if kind == "F" else run.backward)(i)
    for work in run.sent:  # every isend has a matching recv: the schedule was played first
        work.wait()
    return stage_grads(stage)


class _StageRun:
    """One rank's stage while it runs a schedule, and what it holds for each micro-batch in
    flight. Messages are tagged: forward of i with i, backward of i with n_micro + i."""

    def __init__(self, stage, micro_batches, n_micro, last_stage):
        self.stage, self.micro_batches, self.m = stage, micro_batches, n_micro
        self.rank, p = dist.get_rank(), dist.get_world_size()
        self.first, self.last = self.rank == 0, self.rank == p - 1
        self.student = last_stage if self.last else None
        self.inputs, self.outputs, self.sent = {}, {}, []

    def forward(self, i):
        x, y = self.micro_batches[i]  # (micro_size, d) each: x is stage 0's, y the last's
        if not self.first:  # a leaf; the student's last stage must ask for its gradient
            x = self._recv(x, self.rank - 1, tag=i).requires_grad_(self.student is None)
        self.inputs[i] = x
        if self.student:
            self.outputs[i] = self.student(self.stage, x, y)  # x's gradient, to send back
        elif self.last:
            self.outputs[i] = F.mse_loss(self.stage(x), y) / self.m  # its share of the mean
        else:
            self.outputs[i] = self.stage(x)  # (micro_size, d)
            self.sent.append(dist.isend(self.outputs[i].detach(), self.rank + 1, tag=i))

    def backward(self, i):
        out, x = self.outputs.pop(i), self.inputs.pop(i)
        if self.student:
            grad_x = out
        else:  # the loss starts its own backward; a middle stage's output gets the next's
            out.backward(None if self.last else self._recv(out, self.rank + 1, self.m + i))
            grad_x = x.grad
        if not self.first:
            self.sent.append(dist.isend(_sendable(grad_x, x), self.rank - 1, tag=self.m + i))

    @staticmethod
    def _recv(like, src, tag):
        """A blocking receive of a float64 tensor shaped like `like` from src, with this tag."""
        buffer = torch.empty(like.shape, dtype=torch.float64)
        dist.recv(buffer, src, tag=tag)
        return buffer


def _sendable(grad, like):
    """What the previous stage receives: a (micro_size, d) float64 tensor; NaN where the
    student's answer was not one, so the earlier ranks' gradients show it."""
    if isinstance(grad, torch.Tensor) and grad.shape == like.shape:
        return grad.detach().to(torch.float64).contiguous()
    return torch.full(like.shape, float("nan"), dtype=torch.float64)

