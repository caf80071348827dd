"""ZeRO stage 2 (P_os+g): gradients partitioned too (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage2(GPT(config), group, bucket_cap_mb=25)
    optimizer = ZeroAdamW(model, lr=1e-3)      # the same loop as stage 1 and lesson 03

Lesson 03's hooks, with a reduce-scatter instead of an all-reduce: each parameter's
`register_post_accumulate_grad_hook` fires when its gradient is final; once every gradient of a
unit (a bucket) is in, the unit is flattened, reduce-scattered asynchronously while backward goes
on, and the full gradients are dropped. A rank keeps the averaged s values of its own shard
(2Ψ/N bytes of gradients between steps instead of 2Ψ) and, during backward, the full gradients of
the buckets not yet sent. With one bucket (the default 25 MB cap holds all of a small model) that
is every gradient until backward ends, as in stage 1: the saving during backward needs several
buckets (lesson 05 measures the peak both ways). `GradientReducer` is shared with stage 3.
"""

import torch.distributed as dist
from torch.autograd import Variable

from dlcourse.parallel.timeline import now
from dlcourse.parallel.zero.stage1 import (
    FlatParameters,
    add_shard_gradient,
    reduce_scatter_flat,
)


class GradientReducer:
    """Reduce-scatter each unit's gradients during backward, from gradient hooks.

    units: FlatShards; shards: the tensor per unit that receives the averaged gradient shard
    (.grad). order: the unit indices in the order their reduce-scatters are launched, the same
    on every rank (collectives pair up by call order). on_unit_done(i): called once unit i has
    all its gradients (stage 3 frees its gathered parameters there). timeline: lesson 03's.
    """

    def __init__(self, units, shards, group, order=None, on_unit_done=None, timeline=None):
        self.units, self.shards, self.group = units, shards, group
        self.order = list(range(len(units))) if order is None else list(order)
        self.on_unit_done, self.timeline = on_unit_done, timeline
        self._unit_of = {p: i for i, u in enumerate(units) for p in u.params}
        for p in self._unit_of:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)
        self._reset()

    def _reset(self):
        self._waiting = [len(u.params) for u in self.units]  # gradients each unit awaits
        self._launched = []  # (unit index, output (s,), Work, start time) in launch order
        self._queued = False

    def _on_gradient_ready(self, p):
        if not self._queued:  # once per backward: finish when autograd is done
            self._queued = True
            Variable._execution_engine.queue_callback(self._finish_backward)
        i = self._unit_of[p]
        self._waiting[i] -= 1
        if self._waiting[i] == 0 and self.on_unit_done is not None:
            self.on_unit_done(i)
        while len(self._launched) < len(self.order) and self._waiting[self._next()] == 0:
            self._launch(self._next())

    def _next(self):
        return self.order[len(self._launched)]

    def _launch(self, i):
        self._settle()  # one reduce-scatter in flight at most: the last one's input is released
        unit, start = self.units[i], now()
        flat = unit.flatten([p.grad for p in unit.params])  # (padded,), zeros in the padding
        for p in unit.params:
            p.grad = None  # the full gradient is gone: only the shard will be kept
        out, work = reduce_scatter_flat(unit, flat, self.group, async_op=True)
        self._launched.append((i, out, work, start))

    def _settle(self):
        """Wait for the reduce-scatters launched so far and add their results to the shards."""
        world_size = dist.get_world_size(self.group)
        for k, (i, out, work, start) in enumerate(self._launched):
            if work is not None:
                work.wait()  # gloo's Work has no future: the span ends when this rank saw it done
                if self.timeline is not None:
                    self.timeline.add("reduce-scatter", f"RS{i}", start, now())
                add_shard_gradient(self.shards[i], out, world_size)
                self._launched[k] = (i, None, None, None)  # drops the flat input the Work held

    def _finish_backward(self):
        missing = [n for i, u in enumerate(self.units) if self._waiting[i]
                   for n, p in zip(u.names, u.params) if p.grad is None]
        if missing:
            raise RuntimeError(
                f"ZeRO: {len(missing)} parameter(s) got no gradient in this backward pass "
                f"({', '.join(missing[:5])}); every rank must reduce every unit. Give every "
                "parameter a use in the loss (or requires_grad=False)")
        self._settle()
        self._reset()


class ZeroStage2(FlatParameters):
    """ZeRO stage 2 over `group`: whole parameters, gradient and Adam state for Ψ/N values."""

    stage = 2

    def __init__(self, module, group, bucket_cap_mb=25.0, timeline=None):
        super().__init__(module, group, bucket_cap_mb)
        self.reducer = GradientReducer(self.units, self._shards, group, timeline=timeline)

    def reduce_gradients(self):
        """Nothing left to do at the step: backward reduce-scattered every unit already."""

    def zero_grad(self, set_to_none=True):
        for shard in self._shards:
            shard.grad = None
