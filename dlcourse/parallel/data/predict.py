"""A data-parallel step's communication, predicted with lesson 02's alpha-beta model and measured
against the bucket size (lesson 03).

    alpha, beta = fit_link(group)                                  # lesson 02's ring step, fitted
    predict_all_reduce_seconds(bucket_sizes(model, 1.0), world_size, alpha, beta)
    sweep = time_bucket_sweep(make_model, batch, loss_fn, group, caps=[0, 0.1, 1])  # every rank

Each bucket is one ring all-reduce of its bytes S: 2(n - 1) alpha + 2(n - 1)/n S beta. The bytes
term adds up to the same total whatever the buckets; the alpha term is paid once per bucket, which
is what buckets save. Too few buckets cost something else, which the model leaves out: the last
bucket to fill is launched only when backward ends, so with overlap a big bucket waits longer.
"""

import time

import torch
import torch.distributed as dist

from dlcourse.collectives.cost import fit_alpha_beta, predict_time
from dlcourse.collectives.measure import time_ops
from dlcourse.parallel.data.buckets import all_reduce_buckets, make_buckets
from dlcourse.parallel.data.overlap import DataParallel
from dlcourse.parallel.data.steps import train_step

LINK_SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB: the ring step's messages


def bucket_sizes(model, bucket_cap_mb):
    """Bytes of each bucket `make_buckets` plans for `model` (0 MiB: one bucket per tensor)."""
    return [bucket.nbytes for bucket in make_buckets(model, bucket_cap_mb)]


def predict_all_reduce_seconds(sizes, world_size, alpha, beta):
    """alpha-beta seconds of one ring all-reduce per bucket of `sizes` bytes, one after another."""
    return sum(predict_time("ring all_reduce", s, world_size, alpha, beta) for s in sizes)


def fit_link(group=None, sizes=LINK_SIZES, repeats=5):
    """Run on every rank: (alpha, beta) of lesson 02, fitted to the fastest of `repeats` ring
    steps at each size (load from elsewhere only ever adds time)."""
    seconds = time_ops(["ring step"], sizes, repeats=repeats, group=group, summary=min)
    return fit_alpha_beta(sizes, seconds["ring step"])


def time_bucket_sweep(make_model, batch, loss_fn, group, caps, repeats=5):
    """Run on every rank: {cap: (number of buckets, comm seconds, step seconds)} per `caps` (MiB).

    comm: `all_reduce_buckets` after backward (pack, all-reduce, unpack every bucket);
    step: one SGD training step of `DataParallel(overlap=True)` with that cap. Each is the
    slowest rank's time of a repeat, and the fastest of `repeats` (after one warm-up).
    """
    x, y = batch
    out = {}
    for cap in caps:
        model = make_model()
        loss_fn(model(x), y).backward()
        buckets = make_buckets(model, cap)
        comm = _fastest(lambda: all_reduce_buckets(buckets, group), group, repeats)
        wrapped = DataParallel(make_model(), group, bucket_cap_mb=cap, overlap=True)
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-3)
        step = _fastest(lambda: train_step(wrapped, optimizer, [(x, y)], loss_fn), group, repeats)
        out[cap] = (len(buckets), comm, step)
    return out


def _fastest(fn, group, repeats):
    """The fastest over repeats of the slowest rank's seconds for `fn()`, after one warm-up."""
    times = torch.zeros(repeats, dtype=torch.float64)
    for i in range(-1, repeats):
        dist.barrier(group=group)  # start together: no time includes waiting for a late rank
        start = time.perf_counter()
        fn()
        if i >= 0:
            times[i] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return times.min().item()
