"""Lesson 03's additions: the loss normalised by tokens under accumulation equals one process on
the whole batch (and the per-micro-batch mean does not), and the alpha-beta prediction of the
data-parallel step's communication (dlcourse/parallel/data/tokens.py and predict.py).

Tolerance. The proof runs in float64: the ranks add the same numbers as one process in another
order, so gradients differ by a few float64 roundings of sums of ~1e2 terms, ~1e-15 relative;
1e-12 absolute leaves room for that and nothing else. The wrong normalisation is off by ~1e-2.
"""

import contextlib
import random

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.buckets import make_buckets
from dlcourse.parallel.data.overlap import DataParallel
from dlcourse.parallel.data.predict import (bucket_sizes, predict_all_reduce_seconds,
                                            time_bucket_sweep)
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.data.tokens import (IGNORE, count_tokens, global_token_count, pad_after,
                                           token_loss_sum)

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16)
EXACT = 1e-12  # float64 rounding, see the module docstring


def _gradient_gaps(micro, accumulation, seed):
    """On every rank: largest |grad - one process's grad| for both normalisations."""
    group, world_size = dist.group.WORLD, dist.get_world_size()
    x, y = synthetic_tokens(micro * accumulation * world_size, CFG, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, CFG.seq_len + 1, (x.size(0),), generator=generator)
    y = pad_after(y, lengths)
    whole = GPT(CFG, seed=0).double()
    (token_loss_sum(whole(x), y) / count_tokens(y)).backward()  # reference: every real token once
    xs, ys = shard_batch((x, y), group)
    micro_batches = list(zip(xs.split(micro), ys.split(micro)))
    n_tokens = global_token_count([t for _, t in micro_batches], group)
    gaps = {}
    for name in ("per micro-batch mean", "global token count"):
        model = DataParallel(GPT(CFG, seed=0).double(), group, bucket_cap_mb=0.001)
        for i, (xm, ym) in enumerate(micro_batches):
            with model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
                if name == "per micro-batch mean":
                    loss = token_loss_sum(model(xm), ym) / count_tokens(ym) / len(micro_batches)
                else:
                    loss = token_loss_sum(model(xm), ym) * world_size / n_tokens
                loss.backward()
        gaps[name] = max((p.grad - q.grad).abs().max().item()
                         for p, q in zip(model.module.parameters(), whole.parameters()))
    return n_tokens, gaps


@pytest.mark.parametrize("world_size, micro, accumulation", [(2, 2, 3), (3, 1, 2), (4, 3, 1)])
def test_dividing_by_the_global_token_count_gives_the_one_process_gradient(world_size, micro,
                                                                           accumulation):
    seed = random.randrange(10**6)
    results = dlcourse.launch(_gradient_gaps, micro, accumulation, seed, world_size=world_size,
                              backend="gloo")
    for rank, (n_tokens, gaps) in enumerate(results):
        assert gaps["global token count"] < EXACT, (seed, rank, gaps)
        assert gaps["per micro-batch mean"] > 1e-6, (seed, rank, gaps)  # the bug is visible
    assert len({n for n, _ in results}) == 1  # every rank divides by the same count


def test_pad_after_marks_the_tail_and_refuses_bad_lengths():
    targets = torch.arange(12).view(3, 4)
    padded = pad_after(targets, [4, 1, 2])
    assert padded.tolist() == [[0, 1, 2, 3], [4, IGNORE, IGNORE, IGNORE], [8, 9, IGNORE, IGNORE]]
    assert count_tokens(padded) == 7
    assert targets[1, 1] == 5  # a copy: the caller's targets are untouched
    for bad in ([0, 1, 2], [5, 1, 1], [1, 2]):
        with pytest.raises(ValueError, match="one length per sequence"):
            pad_after(targets, bad)


def test_the_token_sum_is_lm_loss_times_the_tokens_when_nothing_is_padded():
    x, y = synthetic_tokens(3, CFG, seed=1)
    logits = GPT(CFG, seed=0)(x)
    torch.testing.assert_close(token_loss_sum(logits, y), lm_loss(logits, y) * y.numel())


def test_the_prediction_pays_alpha_once_per_bucket_and_the_bytes_once_in_all():
    model = GPT(CFG, seed=0)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for cap in (0, 0.004, 1.0):
        sizes = bucket_sizes(model, cap)
        assert len(sizes) == len(make_buckets(model, cap)) and sum(sizes) == n_bytes
        only_alpha = predict_all_reduce_seconds(sizes, 4, alpha=1.0, beta=0.0)
        only_beta = predict_all_reduce_seconds(sizes, 4, alpha=0.0, beta=1.0)
        assert only_alpha == pytest.approx(len(sizes) * 2 * 3)  # 2(n - 1) messages per bucket
        assert only_beta == pytest.approx(2 * 3 / 4 * n_bytes)  # the ring's bytes, any caps


def _sweep(caps):
    group = dist.group.WORLD
    batch = shard_batch(synthetic_tokens(4, CFG, seed=1), group)
    return time_bucket_sweep(lambda: GPT(CFG, seed=0), batch, lm_loss, group, caps, repeats=2)


def test_the_sweep_reports_the_buckets_and_a_time_for_each_cap():
    caps = [0, 0.004, 1.0]
    results = dlcourse.launch(_sweep, caps, world_size=2, backend="gloo")
    assert results[0] == results[1]  # every rank reports the slowest rank's times
    for cap in caps:
        n, comm, step = results[0][cap]
        assert n == len(make_buckets(GPT(CFG), cap))
        assert comm > 0 and step > 0
