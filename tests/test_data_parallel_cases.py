"""Lesson 03's harder cases on real gloo ranks: parameters without a gradient, uneven local
batches, the overlap itself, the bucket plan, and the errors a student meets.
Tolerances as in test_data_parallel.py (fp32 rounding; AdamW's near-zero gradients)."""

import matplotlib.pyplot as plt
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import dlcourse
from dlcourse.models import GPT, GPTConfig, MLP, MLPConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.buckets import make_buckets
from dlcourse.parallel.data.compare import NAMES, VARIANTS, count_step, ring_all_reduce_bytes, wrap
from dlcourse.parallel.data.steps import shard_batch, train_step, uneven_loss_scale
from dlcourse.parallel.timeline import Span, Timeline
from dlcourse.plots.timeline import _stack_overlaps, plot_timeline
from dlcourse.tour import MATCH_TOLERANCE

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16)
CAP_MB = 0.004


class WithUnused(nn.Module):
    """A GPT with a layer it never uses and one it uses only when told to."""

    def __init__(self):
        super().__init__()
        self.gpt = GPT(CFG, seed=0)
        self.never = nn.Linear(4, 4)
        self.sometimes = nn.Linear(CFG.vocab_size, CFG.vocab_size)

    def forward(self, x, use_sometimes):
        logits = self.gpt(x)  # (B, T, V)
        return logits + self.sometimes(logits) if use_sometimes else logits


def train_with_unused(variant, find_unused_parameters=True, steps=3):
    """AdamW steps in which rank r uses `sometimes` when r + step is even: some ranks use it,
    others do not, in every step."""
    group, rank = dist.group.WORLD, dist.get_rank()
    torch.manual_seed(0)  # the same nn.Linear weights on every rank and in every variant
    model = wrap(variant, WithUnused(), group, CAP_MB, find_unused_parameters)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = shard_batch(synthetic_tokens(8, CFG, seed=1), group)
    start = {n: p.detach().clone() for n, p in model.module.named_parameters()}
    for step in range(steps):
        optimizer.zero_grad()
        lm_loss(model(x, (rank + step) % 2 == 0), y).backward()
        optimizer.step()
    never_grad = model.module.never.weight.grad
    return start, {n: p.detach().clone() for n, p in model.module.named_parameters()}, never_grad


def train_every_variant_with_unused():
    return {variant: train_with_unused(variant) for variant in NAMES}  # one job: see the note
    # in test_data_parallel.train_everything on DDP's first use


def test_parameters_unused_on_some_ranks_match_ddp_and_unused_everywhere_stay_untouched():
    runs = dlcourse.launch(train_every_variant_with_unused, world_size=4, backend="gloo")[0]
    _, theirs, _ = runs["torch DDP"]
    for variant in VARIANTS:
        start, ours, never_grad = runs[variant]
        for name in ours:
            assert (ours[name] - theirs[name]).abs().max() <= MATCH_TOLERANCE, (variant, name)
        assert never_grad is None  # no rank used it: no gradient, as in one process
        assert torch.equal(ours["never.weight"], start["never.weight"])  # AdamW skipped it
        assert not torch.equal(ours["sometimes.weight"], start["sometimes.weight"])  # trained


def test_an_unused_parameter_without_find_unused_parameters_is_a_clear_error():
    with pytest.raises(dlcourse.RankError, match="never.weight.*find_unused_parameters=True"):
        dlcourse.launch(train_with_unused, "overlapped", False, world_size=2, backend="gloo")


def train_on_uneven_shards(scale_loss):
    """10 sequences on 4 ranks (3, 3, 2, 2), 3 SGD steps; with or without uneven_loss_scale."""
    group = dist.group.WORLD
    data = synthetic_tokens(10, CFG, seed=1)
    whole = GPT(CFG, seed=0)
    optimizers = [torch.optim.SGD(whole.parameters(), lr=0.5)]
    model = wrap("overlapped", GPT(CFG, seed=0), group, bucket_cap_mb=CAP_MB)
    optimizers.append(torch.optim.SGD(model.parameters(), lr=0.5))
    x, y = shard_batch(data, group, allow_uneven=True)
    scale = uneven_loss_scale(x.size(0), group) if scale_loss else 1.0
    for _ in range(3):
        train_step(whole, optimizers[0], [data], lm_loss)
        train_step(model, optimizers[1], [(x, y)], lm_loss, loss_scale=scale)
    return max((a - b).abs().max().item()
               for a, b in zip(whole.parameters(), model.module.parameters()))


def both_ways_on_uneven_shards():
    return train_on_uneven_shards(False), train_on_uneven_shards(True)


def test_uneven_local_batches_need_the_loss_scaled_by_each_ranks_share():
    wrong, right = dlcourse.launch(both_ways_on_uneven_shards, world_size=4, backend="gloo")[0]
    assert wrong > 1e-4  # plain averaging weighs the 2-sample ranks like the 3-sample ones
    assert right <= 1e-6  # SGD rounding only


def test_a_batch_that_does_not_split_says_the_arithmetic():
    def split_ten():
        shard_batch(torch.zeros(10, 3), dist.group.WORLD)

    with pytest.raises(dlcourse.RankError, match=r"10 samples .* 4 ranks \(10 / 4 = 2\.5\)"):
        dlcourse.launch(split_ten, world_size=4, backend="gloo")


def test_different_models_on_the_ranks_are_a_clear_error():
    def build_by_rank():
        cfg = MLPConfig(hidden=8 + dist.get_rank())
        wrap("overlapped", MLP(cfg), dist.group.WORLD)

    with pytest.raises(dlcourse.RankError, match="same model on every rank"):
        dlcourse.launch(build_by_rank, world_size=2, backend="gloo")


def test_wrapping_starts_every_rank_from_rank_0s_weights():
    def wrapped_weights():
        out = {}
        for variant in NAMES:
            model = wrap(variant, GPT(CFG, seed=dist.get_rank()), dist.group.WORLD)  # all differ
            out[variant] = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        return out

    expected = dict(GPT(CFG, seed=0).named_parameters())
    for weights in dlcourse.launch(wrapped_weights, world_size=2, backend="gloo"):
        for variant in NAMES:
            assert all(torch.equal(weights[variant][n], expected[n]) for n in expected), variant


def one_recorded_step(overlap):
    """Spans of one step of an MLP with 4 buckets: forward, backward, each all-reduce."""
    timeline = Timeline(dist.get_rank())
    config = MLPConfig(d_in=64, hidden=256, n_layers=4, d_out=64)
    model = wrap("overlapped" if overlap else "bucketed", MLP(config), dist.group.WORLD,
                 bucket_cap_mb=0.25, timeline=timeline)
    x = torch.randn(32, 64)
    model(x).square().mean().backward()
    return timeline.spans


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_starts_all_reduces_before_backward_ends(overlap):
    for spans in dlcourse.launch(one_recorded_step, overlap, world_size=2, backend="gloo"):
        backward = next(s for s in spans if s.name == "backward")
        reduces = [s for s in spans if s.lane == "all-reduce"]
        assert len(reduces) == 4
        started_early = [s.start < backward.end for s in reduces]
        assert any(started_early) if overlap else not any(started_early)


def test_buckets_take_parameters_last_layer_first_up_to_the_cap():
    model = MLP(MLPConfig(d_in=16, hidden=64, n_layers=3, d_out=16))
    buckets = make_buckets(model, bucket_cap_mb=20_000 / 2**20)  # 20 KB: 5,000 fp32 values
    names = [n for b in buckets for n in b.names]
    assert names == [n for n, _ in model.named_parameters()][::-1]
    for b in buckets[:-1]:  # each closes at the first parameter that reaches the cap
        assert b.nbytes >= 20_000 and b.nbytes - b.params[-1].numel() * 4 < 20_000
    assert len(make_buckets(model, bucket_cap_mb=0)) == len(names)  # one each
    assert len(make_buckets(model, bucket_cap_mb=25)) == 1


def test_timeline_stacks_spans_in_flight_together_and_draws_each_once():
    spans = [Span(0, "all-reduce", "bucket 0", 0.0, 2.0), Span(0, "all-reduce", "bucket 1", 1.0, 3.0),
             Span(0, "all-reduce", "bucket 2", 2.5, 4.0), Span(0, "compute", "backward", 0.0, 4.0),
             Span(1, "compute", "backward", 0.5, 3.0)]
    levels = {(s.rank, s.name): (level, n) for s, level, n in _stack_overlaps(spans)}
    assert levels == {(0, "bucket 0"): (0, 2), (0, "bucket 1"): (1, 2), (0, "bucket 2"): (0, 2),
                      (0, "backward"): (0, 1), (1, "backward"): (0, 1)}
    ax = plot_timeline(spans, "test")
    widths = sorted(round(bar.get_width()) for bar in ax.patches)  # ms
    assert widths == [1500, 2000, 2000, 2500, 4000]
    plt.close(ax.figure)


def counted_bytes():
    group = dist.group.WORLD
    batch = shard_batch(synthetic_tokens(8, CFG, seed=1), group)
    return {v: count_step(v, GPT(CFG, seed=0), batch, lm_loss, group, CAP_MB).by_op()
            for v in NAMES}


def test_every_variant_sends_the_ring_all_reduce_bytes_of_the_gradients():
    n_params = sum(p.numel() for p in GPT(CFG).parameters())  # the tied matrix once
    expected = ring_all_reduce_bytes(n_params, world_size=4)
    counted = dlcourse.launch(counted_bytes, world_size=4, backend="gloo")[0]
    n_buckets = len(make_buckets(GPT(CFG), CAP_MB))
    for variant, ops in counted.items():
        calls, _, bus_bytes = ops["all_reduce"]
        assert bus_bytes == expected, variant
        assert calls == (len(list(GPT(CFG).parameters())) if variant == "naive" else n_buckets)
    assert counted["torch DDP"]["broadcast"][1] == sum(b.nbytes for b in GPT(CFG).buffers())


def checkpointed_gradients(use_reentrant, checkpoint_lm_head=False):
    """Gradients of a GPT whose blocks recompute their forward in backward (lesson 01), wrapped
    in DataParallel, beside one process's on the whole batch. checkpoint_lm_head: the output
    layer too, whose weight is tied to the embedding used outside it."""
    group = dist.group.WORLD
    x, y = synthetic_tokens(8, CFG, seed=1)
    whole = GPT(CFG, seed=0)
    lm_loss(whole(x), y).backward()
    model = GPT(CFG, seed=0)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = Checkpointed(block, use_reentrant)
    if checkpoint_lm_head:
        model.lm_head = Checkpointed(model.lm_head, use_reentrant)
    model = wrap("overlapped", model, group, bucket_cap_mb=CAP_MB)
    xs, ys = shard_batch((x, y), group)
    lm_loss(model(xs), ys).backward()
    return max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.module.parameters(), whole.parameters()))


class Checkpointed(nn.Module):
    def __init__(self, inner, use_reentrant):
        super().__init__()
        self.inner, self.use_reentrant = inner, use_reentrant

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=self.use_reentrant)


def test_activation_checkpointing_composes_with_data_parallel():
    def every_kind():  # (use_reentrant, checkpoint_lm_head)
        return [checkpointed_gradients(*kind) for kind in [(False, False), (True, False), (False, True)]]

    for diff in dlcourse.launch(every_kind, world_size=2, backend="gloo")[0]:
        assert diff <= 1e-7  # fp32 rounding of the gradients


def test_a_tied_weight_finished_twice_by_a_reentrant_checkpoint_is_refused():
    with pytest.raises(dlcourse.RankError, match="finished twice.*use_reentrant=False"):
        dlcourse.launch(checkpointed_gradients, True, True, world_size=2, backend="gloo")
