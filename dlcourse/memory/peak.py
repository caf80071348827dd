"""The true peak of a forward and backward: every allocation, not only saved tensors (lesson 01).

    peak = measure_peak(model, x, y, lm_loss)
    peak.bytes, peak.phase          # the most bytes held at once, and in which phase
    peak.at_forward_end             # what was held when forward returned

`measure_step` counts what a step must keep (parameters, saved tensors, gradients, optimizer
state), so its peak is a lower bound. Backward also makes tensors that nothing saves: the
gradient of the logits, the gradient flowing back through each layer, the temporaries of every
op. torch's profiler with `profile_memory=True` records each allocation and each free of the
CPU allocator ("[memory]" events, + or - bytes); their running sum is every live tensor's bytes.
On a GPU, `torch.cuda.max_memory_allocated` gives the same figure directly.
"""

import contextlib
import os
import sys
from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile, record_function

from dlcourse.memory.measure import storage_bytes


@dataclass
class PeakMemory:
    """Bytes held by every live tensor (parameters and inputs included) during one step."""

    bytes: int  # the most held at once
    phase: str  # "forward" or "backward": where that was
    at_forward_end: int  # held when forward returned (saved tensors, loss, and what is left)
    at_end: int  # held after backward (the gradients are the new part)


def measure_peak(model, inputs, targets, loss_fn):
    """Run forward and backward of `loss_fn(model(inputs), targets)` under torch's profiler and
    return the `PeakMemory` of every CPU allocation. `.grad` must be empty (set_to_none)."""
    if any(p.grad is not None for p in model.parameters()):
        raise ValueError("measure_peak needs empty gradients: call "
                         "model.zero_grad(set_to_none=True) first, so that backward allocates them")
    already = storage_bytes([*model.parameters(), inputs, targets])  # held before the step
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            loss = loss_fn(model(inputs), targets)
        with record_function("backward"):
            loss.backward()
    del loss
    events = list(prof.profiler.kineto_results.events())
    forward = next(e for e in events if e.name() == "forward")
    forward_end = forward.start_ns() + forward.duration_ns()
    return running_sum(events, forward_end, already)


def running_sum(events, forward_end, already):
    """Walk the allocator's events in time order: +bytes for an allocation, -bytes for a free."""
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    held, peak, phase, at_forward_end = already, already, "forward", None
    for e in memory:
        if at_forward_end is None and e.start_ns() > forward_end:
            at_forward_end = held
        held += e.nbytes()
        if held > peak:
            peak, phase = held, "forward" if e.start_ns() <= forward_end else "backward"
    return PeakMemory(bytes=peak, phase=phase, at_forward_end=at_forward_end or held, at_end=held)


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 while the profiler runs: its C++ side (kineto) logs a line at
    start and at stop that no setting turns off. Exceptions still propagate as usual."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
