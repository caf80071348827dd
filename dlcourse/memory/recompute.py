"""Activation checkpointing for the course GPT, and the compute it costs (lesson 01).

    checkpoint_blocks(model)             # each Block keeps only its input for backward
    step_flops(model, x, y, lm_loss)     # {"forward": ..., "backward": ...} FLOPs of one step

`torch.utils.checkpoint` runs a block's forward without saving anything inside it, keeps the
block's input, and runs the forward again during backward to rebuild what the gradient needs.
This is Korthikanti et al.'s "full" recomputation: per layer 2sbh bytes in 16-bit (the input),
paid for with one more forward pass of every checkpointed block, or nearly. torch's
non-reentrant checkpoint stops the rerun as soon as the last tensor backward needs has been saved
again. A matmul saves its inputs before it computes, so in a block that ends with the MLP's output
projection (dropout 0) the rerun stops before that matmul. With dropout after the projection
(lesson 01 uses 0.1) the last saved tensor is the dropout's mask, and the rerun is the block's
whole forward: `step_flops` counts exactly n_layers block forwards more. Layers outside the
checkpointed blocks (the output layer) are not rerun, so a step costs less than a third more.
torchtitan's `apply_ac` and torch's `apply_activation_checkpointing` wrap blocks the same way.
"""

import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode


class Checkpointed(nn.Module):
    """Wraps a module so that its forward runs under `torch.utils.checkpoint`."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, *args):
        # use_reentrant=False: torch's recommended implementation; it works with
        # saved_tensors_hooks, so `measure_step` sees the one input each block keeps.
        return checkpoint(self.block, *args, use_reentrant=False)


def checkpoint_blocks(model):
    """Wrap every block of `model.blocks` (the course GPT's transformer layers) in
    `Checkpointed`, in place, and return the model. Weights and outputs are unchanged."""
    if not isinstance(getattr(model, "blocks", None), nn.ModuleList):
        raise TypeError(f"checkpoint_blocks needs a model with a ModuleList `blocks`, like "
                        f"dlcourse.models.GPT; got {type(model).__name__}")
    for i, block in enumerate(model.blocks):
        if not isinstance(block, Checkpointed):
            model.blocks[i] = Checkpointed(block)
    return model


def step_flops(model, inputs, targets, loss_fn):
    """Floating-point operations of one forward and one backward, counted by torch's
    `FlopCounterMode` (matmuls and attention; elementwise ops count as free). With
    checkpointing the backward count includes the recomputed forward of every block."""
    with FlopCounterMode(display=False) as counter:
        loss = loss_fn(model(inputs), targets)
        forward = counter.get_total_flops()
        loss.backward()
    model.zero_grad(set_to_none=True)
    return {"forward": forward, "backward": counter.get_total_flops() - forward}
