"""What the divergence finder records of one training run (lesson 10, `lessons/10_debugging.ipynb`).

Three things per step, on each rank, named like the plain GPT's modules and parameters:
  activations  every module's forward output, from forward hooks (a module called once per
               micro-batch is called several times: its outputs are put end to end on dim 0)
  gradients    every whole gradient, read just before the optimizer's step (`intercept_step`):
               after every reduction the strategy makes, before the update uses them
  parameters   every whole parameter after the step

Whole tensors come from the strategy's own unshard helper (`full_parameters`): to read the
gradients the same way, `grads_as_values` lends each parameter (or ZeRO shard) its gradient as
its value while the helper runs, so the helper that gathers parameters gathers gradients.
"""

from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor

from dlcourse.parallel.zero.stage1 import FlatParameters


def plain_name(name):
    """A wrapped module's name as the plain GPT names it: 'module.blocks.0' -> 'blocks.0'."""
    while name.startswith("module."):
        name = name[len("module."):]
    return "" if name == "module" else name


class ActivationLog:
    """Forward hooks on every named module of `modules`: `outputs[name]` is the list of the
    tensors it returned this step (detached copies). `order` is the names in first-call order."""

    def __init__(self, modules):
        self.outputs, self.order, self.handles = {}, [], []
        for module in modules:
            for name, m in module.named_modules():
                name = plain_name(name)
                if name:  # the whole model's output is the last module's (lm_head)
                    self.handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def record(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(out, DTensor):  # DTensor TP: this rank's piece, as the course's TP
                out = out.to_local()      # hands it (compare.py decides if it is comparable)
            if torch.is_tensor(out) and out.is_floating_point():
                if name not in self.outputs:
                    self.outputs[name] = []
                    self.order.append(name)
                self.outputs[name].append(out.detach().clone())
        return record

    def take(self):
        """{name: output} of this step (calls joined on dim 0), and start a new step."""
        taken = {n: torch.cat(self.outputs[n]) if len(self.outputs[n]) > 1 else self.outputs[n][0]
                 for n in self.order}
        self.outputs, self.order[:] = {}, []
        return taken

    def remove(self):
        for h in self.handles:
            h.remove()


def intercept_step(optimizer, before):
    """Call `before()` every time `optimizer` is about to update: just before the inner torch
    optimizer's step (ZeroAdamW's `inner`: after its reduce-scatter and clipping)."""
    target = getattr(optimizer, "inner", optimizer)
    step = target.step

    def step_after(*args, **kwargs):
        before()
        return step(*args, **kwargs)
    target.step = step_after  # on this instance only; the class is untouched


@contextmanager
@torch.no_grad()
def grads_as_values(tensors):
    """Inside the block each tensor's value is its gradient (zeros where it has none). A DTensor
    (DTensor TP, FSDP2) gets it by a copy: assigning a DTensor's .data does not reach the local
    shard that its full_tensor() gathers (measured: the values stayed the parameters')."""
    saved = [t.detach().clone() if isinstance(t, DTensor) else t.data for t in tensors]
    for t in tensors:
        grad = t.grad if t.grad is not None else torch.zeros_like(t)
        if isinstance(t, DTensor):
            t.copy_(grad)  # the gradient has the parameter's placements: a local copy
        else:
            t.data = grad
    try:
        yield
    finally:
        for t, value in zip(tensors, saved):
            if isinstance(t, DTensor):
                t.copy_(value)
            else:
                t.data = value


@contextmanager
@torch.no_grad()
def gradients_shown(modules):
    """Inside the block the parameters of `modules` hold their gradients, so a strategy's
    `full_parameters()` returns whole gradients. ZeRO: stage 3 gathers from its shards, which
    get their gradients; stages 1 and 2 keep whole parameters, so the shards' gradients are
    all-gathered into them with the stage's own `gather_parameters`, and the values put back."""
    with _shown(list(modules)):
        yield


@contextmanager
def _shown(modules):
    if not modules:
        yield
        return
    m, rest = modules[0], modules[1:]
    stage = getattr(m, "stage", None)
    if stage == 3:
        with grads_as_values(m.shards()), _shown(rest):
            yield
    elif stage in (1, 2):
        saved = [f.clone() for f in m.flat_params]
        with grads_as_values(m.shards()):
            FlatParameters.gather_parameters(m)  # the step's all-gather, of the gradients
        try:
            with _shown(rest):
                yield
        finally:
            for flat, values in zip(m.flat_params, saved):
                flat.copy_(values)
    else:
        with grads_as_values(list(m.parameters())), _shown(rest):
            yield
