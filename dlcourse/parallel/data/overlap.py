"""`DataParallel`: data parallelism with DDP's interface, built from scratch (lesson 03, step 3).

    model = DataParallel(GPT(config), group, bucket_cap_mb=1)   # like DistributedDataParallel
    loss_fn(model(x), y).backward()      # returns with every .grad averaged over the group
    with model.no_sync():                # gradient accumulation: this backward stays local
        ...

How it works. Every parameter gets a hook (`register_post_accumulate_grad_hook`) that fires as
soon as backward has finished its gradient. When all the gradients of a bucket are in, the
bucket's all-reduce starts asynchronously (`async_op=True`) while backward goes on computing
the gradients of earlier layers: communication overlaps computation. The first hook also queues
a callback that autograd runs when backward is done; it launches what is left, waits for every
all-reduce and copies the averages back into `.grad` (DDP does the same in C++, in its Reducer).
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd import Variable

from dlcourse.parallel.data.buckets import all_reduce_bucket, finish_bucket, make_buckets
from dlcourse.parallel.data.steps import broadcast_parameters, check_same_model
from dlcourse.parallel.timeline import now


class DataParallel(nn.Module):
    """Wrap `module` for data parallelism over `group` (`dist.group.WORLD` for every rank).

    bucket_cap_mb: MiB of gradients per all-reduce (0: one all-reduce per parameter tensor).
    overlap: start each bucket's all-reduce during backward (True) or after it (False).
    find_unused_parameters: after each forward, walk the autograd graph for parameters that
        get no gradient this step and reduce zeros for them, as DDP does; off by default,
        because the walk costs time every step.
    timeline: a `dlcourse.parallel.timeline.Timeline` to record forward, backward and each
        bucket's all-reduce in (for the lesson's figure), or None.
    """

    def __init__(self, module, group, bucket_cap_mb=25.0, overlap=True,
                 find_unused_parameters=False, timeline=None):
        super().__init__()
        self.module = module
        self.group = group
        self.overlap = overlap
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True  # no_sync() sets it False, as in DDP
        self.timeline = timeline
        check_same_model(module, group)
        broadcast_parameters(module, group)  # every replica starts from rank 0's weights
        self.buckets = make_buckets(module, bucket_cap_mb)
        self._bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b.params}
        for p in self._bucket_of:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)
        self._start_step(sync=False)

    def forward(self, *args, **kwargs):
        # As in DDP, whether this step's backward synchronises is decided at forward time.
        self._start_step(sync=self.require_backward_grad_sync and torch.is_grad_enabled())
        start = now()
        output = self.module(*args, **kwargs)
        self._record("compute", "forward", start, now())
        if self._sync and self.find_unused_parameters:
            self._unused = set(self._bucket_of) - used_parameters(output)
        if self._sync:
            for t in _tensors(output):
                if t.requires_grad:  # its gradient is the first thing backward computes
                    t.register_hook(self._on_backward_start)
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside it only accumulate gradients locally; the first backward
        after it averages the accumulated sum over the ranks, once."""
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    # --- one backward pass ---------------------------------------------------------------

    def _start_step(self, sync):
        self._sync = sync  # does the next backward average gradients?
        self._ready = set()  # parameters whose gradient is final
        self._waiting = [len(b.params) for b in self.buckets]  # gradients each bucket awaits
        self._launched = []  # (bucket, Work) in launch order: bucket 0, 1, 2, ...
        self._unused = set()  # get no gradient this step (find_unused_parameters)
        self._backward_start = None  # when it started, for the timeline
        self._finish_queued = False

    def _on_backward_start(self, grad):
        if self._sync:
            self._backward_start = self._backward_start or now()
            self._queue_finish()

    def _queue_finish(self):
        """Once per backward: ask autograd to call `_finish_backward` when it is done. Queued
        from the output's gradient if possible: a hook inside a reentrant checkpoint runs in a
        nested backward, whose end is not the end of ours."""
        if not self._finish_queued:
            self._finish_queued = True
            Variable._execution_engine.queue_callback(self._finish_backward)
            for q in self._unused:
                self._mark_ready(q)  # no gradient coming: it is ready now, as zeros

    def _on_gradient_ready(self, p):
        if not self._sync:
            return
        if p in self._ready:
            raise RuntimeError(
                "DataParallel: a parameter's gradient was finished twice in one backward pass, "
                "after its bucket may have been sent. Reentrant activation checkpointing of a "
                "part that shares weights with the rest does this: use "
                "torch.utils.checkpoint.checkpoint(..., use_reentrant=False)."
            )
        self._queue_finish()  # in case the loss did not come from the output's gradient
        self._mark_ready(p)

    def _mark_ready(self, p):
        self._ready.add(p)
        self._waiting[self._bucket_of[p]] -= 1
        if self.overlap:
            self._launch_ready_buckets()

    def _launch_ready_buckets(self):
        # Collectives pair up across ranks by the order of the calls, so every rank launches
        # bucket 0, then 1, then 2...: a full bucket waits until the buckets before it went.
        while len(self._launched) < len(self.buckets) and self._waiting[len(self._launched)] == 0:
            self._launch(len(self._launched))

    def _launch(self, i):
        bucket, start = self.buckets[i], now()
        work = all_reduce_bucket(bucket, self.group, async_op=True)
        if self.timeline is not None:  # the future completes when the all-reduce has finished
            work.get_future().then(lambda _: self._record("all-reduce", f"bucket {i}", start, now()))
        self._launched.append((bucket, work))

    def _finish_backward(self):
        """Queued by the first hook; autograd runs it when backward has computed everything."""
        backward_end = now()
        self._record("compute", "backward", self._backward_start or backward_end, backward_end)
        self._check_every_gradient_arrived()
        while len(self._launched) < len(self.buckets):
            self._launch(len(self._launched))
        for _, work in self._launched:
            work.wait()
        used = self._globally_used() if self.find_unused_parameters else {}
        for bucket, _ in self._launched:
            finish_bucket(bucket, self.group, [used.get(p, True) for p in bucket.params])
        self._record("compute", "wait for all-reduce", backward_end, now())
        self._sync = False

    def _check_every_gradient_arrived(self):
        missing = [name for b in self.buckets for name, p in zip(b.names, b.params)
                   if p not in self._ready]
        if missing:
            raise RuntimeError(
                f"DataParallel: {len(missing)} parameter(s) got no gradient in this backward "
                f"pass: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Their "
                "bucket can never be reduced, and the ranks must all reduce the same buckets. "
                "If the model skips them in some steps, wrap it with "
                "find_unused_parameters=True (as with DistributedDataParallel)."
            )

    def _globally_used(self):
        """parameter -> True if some rank has a gradient for it (one extra small all-reduce)."""
        params = list(self._bucket_of)
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        dist.all_reduce(has_grad, group=self.group)  # how many ranks have one
        return {p: bool(n) for p, n in zip(params, has_grad.tolist())}

    def _record(self, lane, name, start, end):
        if self.timeline is not None:
            self.timeline.add(lane, name, start, end)


def used_parameters(output):
    """The parameters reachable from `output` through its autograd graph: those that will get a
    gradient in backward. DDP's find_unused_parameters=True makes this walk after every forward."""
    stack = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    seen, used = set(), set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node: writes one leaf's .grad
            used.add(node.variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return used


def _tensors(output):
    if torch.is_tensor(output):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []
