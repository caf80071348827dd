"""ZeRO stage 3 (P_os+g+p): parameters partitioned too (lesson 05: `lessons/05_zero.ipynb`).

    model = ZeroStage3(GPT(config), group)     # units: each transformer Block, and the rest
    optimizer = ZeroAdamW(model, lr=1e-3)      # the same loop as stages 1, 2 and lesson 03

A rank keeps only its s values of every unit's flat parameters. A unit's full parameters exist
only while they are needed:
  forward:  all-gather just before the unit runs (a forward pre-hook), free right after it;
  backward: all-gather again when the gradient of the unit's output arrives (a tensor hook),
            free when the unit's last gradient is in, then reduce-scatter its gradients (stage 2).
While unit i computes, the all-gather of the next unit (i+1 in forward, i-1 in backward) is
already under way (`prefetch`), so communication overlaps compute; not from the last block in
backward, which starts at the step's peak (every activation held: see `_before_backward`). The
rest of the model (the embeddings, the final LayerNorm) is the root unit, gathered all step.

Freeing: the parameters are views of one flat buffer per unit; `untyped_storage().resize_(0)`
releases its memory and leaves the views (and the tensors autograd saved from them) in place,
and gathering resizes the same storage back and fills it, so the saved views see the values again.
"""

import time

import torch
import torch.distributed as dist
from torch import nn

from dlcourse.models import Block
from dlcourse.parallel.data.steps import broadcast_parameters, check_same_model
from dlcourse.parallel.zero.shards import FlatShard
from dlcourse.parallel.zero.stage2 import GradientReducer


class ZeroStage3(nn.Module):
    """ZeRO stage 3 over `group`. unit_types: the modules that form a unit each (the course GPT's
    Block). reshard_after_forward=False keeps a unit gathered from its forward to its backward
    (one all-gather per step instead of two: stage 2's communication, more memory)."""

    stage = 3

    def __init__(self, module, group, unit_types=(Block,), reshard_after_forward=True,
                 prefetch=True, timeline=None):
        super().__init__()
        self.module, self.group = module, group
        self.reshard_after_forward, self.prefetch, self.timeline = (reshard_after_forward,
                                                                    prefetch, timeline)
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        check_same_model(module, group)
        broadcast_parameters(module, group)
        blocks = [m for m in module.modules() if isinstance(m, unit_types)]
        if not blocks:
            raise ValueError(f"ZeroStage3: the model has no {[t.__name__ for t in unit_types]} "
                             "module to make a unit of; pass unit_types=(YourBlock,)")
        in_block = [{p for p in b.parameters()} for b in blocks]
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.units = [self._unit([(n, p) for n, p in named if p in ps]) for ps in in_block]
        in_blocks = set().union(*in_block)
        self.units.append(self._unit([(n, p) for n, p in named if p not in in_blocks]))  # root
        self.root = len(self.units) - 1
        self._full = [None] * len(self.units)  # gathered flat buffer (padded,), storage freed
        self._pending = {}  # unit -> (Work, start time) of an all-gather under way
        self._shards = [self._partition(i) for i in range(len(self.units))]  # each (s,)
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda m, a, i=i: self._before_forward(i))
            block.register_forward_hook(lambda m, a, out, i=i: self._after_forward(i, out))
        order = [*reversed(range(len(blocks))), self.root]  # backward finishes the last block first
        self.reducer = GradientReducer(self.units, self._shards, group, order,
                                       on_unit_done=self._after_backward, timeline=timeline)

    def _unit(self, named):
        names, params = zip(*named)  # full names, as in module.named_parameters()
        return FlatShard(names, params, self.world_size, self.rank)

    def _partition(self, i):
        """Move unit i into a flat buffer, keep this rank's shard, free the rest."""
        unit = self.units[i]
        full = unit.flatten([p.detach() for p in unit.params])
        for p, view in zip(unit.params, unit.views(full)):
            p.data = view
        shard = unit.my_shard(full).clone()  # (s,): the only copy this rank keeps
        self._full[i] = full
        self._free(i)
        return shard

    # --- gather and free ----------------------------------------------------------------

    def _gathered(self, i):
        return self._full[i].untyped_storage().nbytes() > 0

    def _gather(self, i, async_op=False):
        if i in self._pending or self._gathered(i):
            return
        full, start = self._full[i], time.perf_counter()
        full.untyped_storage().resize_(full.numel() * full.element_size())
        # A separate tensor on the same storage: the all-gather bumps its version counter, not
        # the parameters', whose saved copies autograd checks in backward.
        target = torch.empty(0, dtype=full.dtype, device=full.device).set_(
            full.untyped_storage(), 0, full.shape)
        work = dist.all_gather_single(target, self._shards[i], group=self.group, async_op=True)
        self._pending[i] = (work, start)
        if not async_op:
            self._wait(i)

    def _wait(self, i):
        work, start = self._pending.pop(i, (None, None))
        if work is not None:
            work.wait()  # gloo's Work has no future: the span ends when this rank saw it done
            self._record("all-gather", f"AG{i}", start)

    def _free(self, i):
        self._wait(i)
        self._full[i].untyped_storage().resize_(0)

    # --- hooks ----------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        self._gather(self.root)  # kept until the root's gradients are in
        return self.module(*args, **kwargs)

    def _before_forward(self, i):
        self._gather(i)
        self._wait(i)
        if self.prefetch and i + 1 < self.root:
            self._gather(i + 1, async_op=True)  # next block's all-gather overlaps this block
        self._forward_start = time.perf_counter()

    def _after_forward(self, i, output):
        self._record("compute", f"F{i}", self._forward_start)
        if torch.is_grad_enabled() and output.requires_grad:
            output.register_hook(lambda grad: self._before_backward(i))
        if self.reshard_after_forward or not torch.is_grad_enabled():
            self._free(i)

    def _before_backward(self, i):
        if i + 1 < self.root:
            # The gradient of block i's output is the gradient of block i+1's input: block i+1's
            # backward has run. Free it now rather than when autograd gets round to
            # accumulating its last parameter gradient, or three blocks could be gathered.
            self._free(i + 1)
        self._gather(i)  # a no-op if the prefetch already started it
        self._wait(i)
        if self.prefetch and 0 < i < self.root - 1:
            # Not from the last block: its backward starts with every activation of the forward
            # still held, the step's peak, and a second gathered unit there would add its full
            # parameters to that peak (measured, benchmarks/zero.py). Later blocks start with
            # fewer activations, so their prefetch fits under it.
            self._gather(i - 1, async_op=True)
        self._backward_start = time.perf_counter()

    def _after_backward(self, i):
        """Unit i has all its gradients: free its parameters (the reducer sends the gradients)."""
        if i != self.root:
            self._record("compute", f"B{i}", self._backward_start)
        self._free(i)

    def _record(self, lane, name, start):
        if self.timeline is not None:
            self.timeline.add(lane, name, start, time.perf_counter())

    # --- the optimizer's side -------------------------------------------------------------

    def shards(self):
        return self._shards

    def reduce_gradients(self):
        """Nothing left to do at the step: backward reduce-scattered every unit already."""

    def gather_parameters(self):
        """Nothing to do after the step: the next forward gathers each unit when it needs it."""

    def zero_grad(self, set_to_none=True):
        for shard in self._shards:
            shard.grad = None

    @torch.no_grad()
    def full_parameters(self):
        """name -> a full copy of every parameter, gathered unit by unit (call on every rank)."""
        out = {}
        for i, unit in enumerate(self.units):
            was_gathered = self._gathered(i)
            self._gather(i)
            out.update({n: p.detach().clone() for n, p in zip(unit.names, unit.params)})
            if not was_gathered:
                self._free(i)
        return {n: out[n] for n, _ in self.module.named_parameters()}
