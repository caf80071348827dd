"""Gradient buckets: many small all-reduces packed into a few big ones (lesson 03, step 2).

An all-reduce costs a fixed latency (alpha) plus time per byte (beta), so one call per gradient
pays alpha once per parameter tensor. A bucket packs the gradients of several parameters end to
end into one flat buffer and reduces them in one call, as DDP does with `bucket_cap_mb`.

    buckets = make_buckets(model, bucket_cap_mb=1)   # plan: which parameters share a buffer
    print(buckets)                                   # the plan is data: names and sizes
    all_reduce_buckets(buckets, group)               # after backward: every .grad averaged
"""

import torch
import torch.distributed as dist

MB = 2**20  # bucket_cap_mb is in MiB, as in DDP


class Bucket:
    """Some parameters whose gradients travel together in one flat buffer.

    The buffer is allocated once and reused every step. `pack` copies the gradients into it,
    one all-reduce sums it over the ranks, `unpack` writes the averages back into `.grad`.
    """

    def __init__(self, names, params):
        self.names = names
        self.params = params
        self.numels = [p.numel() for p in params]
        first = params[0]
        self.buffer = torch.zeros(sum(self.numels), dtype=first.dtype, device=first.device)

    @property
    def nbytes(self):
        return self.buffer.numel() * self.buffer.element_size()

    def views(self):
        """One slice of the flat buffer per parameter, in order: a view, not a copy."""
        return self.buffer.split(self.numels)

    def pack(self):
        """Copy every gradient into the buffer; a parameter without one contributes zeros."""
        for p, view in zip(self.params, self.views()):
            if p.grad is None:
                view.zero_()  # unused on this rank: adds nothing to the sum
            else:
                view.copy_(p.grad.reshape(-1))
        return self.buffer

    def unpack(self, world_size, globally_used=None):
        """Write the summed buffer divided by `world_size` into `.grad`: the averages.

        A parameter with no `.grad` here gets one only if some rank computed a gradient for it
        (`globally_used[i]`); one that no rank used keeps `.grad = None`, as in single-process
        training, so the optimizer leaves it alone.
        """
        for i, (p, view) in enumerate(zip(self.params, self.views())):
            if p.grad is not None:
                torch.div(view.view_as(p), world_size, out=p.grad)  # divide and copy: one pass
            elif globally_used is not None and globally_used[i]:
                p.grad = view.view_as(p) / world_size

    def __repr__(self):
        shown = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
        return f"Bucket({len(self.params)} params, {self.nbytes / MB:.2f} MB: {shown})"


def make_buckets(model, bucket_cap_mb=25.0):
    """Group the trainable parameters into buckets of about `bucket_cap_mb` MiB each.

    Parameters are taken in reverse order of `model.named_parameters()`, roughly the order in
    which backward produces their gradients (last layer first), so the first bucket fills first.
    A bucket is closed once it holds at least `bucket_cap_mb`; 0 puts each parameter alone.
    A tied weight (one Parameter used in two places) appears once: `named_parameters` lists
    each Parameter object once, and its gradient already sums both uses.
    """
    if not bucket_cap_mb >= 0:
        raise ValueError(f"bucket_cap_mb is a size in MiB and must be >= 0, got {bucket_cap_mb!r}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("the model has no trainable parameters (requires_grad=True): "
                         "there are no gradients to all-reduce")
    cap = bucket_cap_mb * MB
    buckets, names, params, size = [], [], [], 0
    for name, p in reversed(named):
        names.append(name)
        params.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(Bucket(names, params))
            names, params, size = [], [], 0
    if params:
        buckets.append(Bucket(names, params))
    return buckets


def all_reduce_bucket(bucket, group, async_op=False):
    """Sum the bucket's packed gradients over the ranks of `group`: one collective call.

    Returns the Work handle when `async_op` (wait on it, then call `finish_bucket`), else None.
    """
    return dist.all_reduce(bucket.pack(), op=dist.ReduceOp.SUM, group=group, async_op=async_op)


def finish_bucket(bucket, group, globally_used=None):
    """Copy the summed buffer back into `.grad`, divided by the world size: the averages."""
    bucket.unpack(dist.get_world_size(group), globally_used)


def all_reduce_buckets(buckets, group):
    """After backward: average every gradient over `group`, one all-reduce per bucket."""
    for bucket in buckets:
        all_reduce_bucket(bucket, group)
        finish_bucket(bucket, group)
