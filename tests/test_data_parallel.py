"""Lesson 03's proofs on 4 real gloo ranks: data parallelism from scratch equals one process
training on the whole batch, and equals torch's DistributedDataParallel.

Tolerances. The ranks add the same fp32 numbers as one process, in another order, so every
gradient differs by rounding (~1e-7 relative).
  SGD moves a weight by lr * gradient, so rounding stays rounding: ~3e-8 after 3 steps at
  lr 0.5 (measured). 1e-6 is far below any real mistake: summing instead of averaging moves the
  weights ~1e-2 apart.
  AdamW divides each gradient by its running magnitude. Where a gradient element is the small
  difference of large terms, its rounding error is a large part of it, and AdamW turns that into
  a step of up to ~lr (the attention key bias is the extreme case: its gradient is zero in exact
  arithmetic, pure rounding noise in fp32). Measured at lr 1e-3 here: 2e-7 to 4e-7 after 3 steps; the
  lesson's larger GPT, ~2.5e-6 after 5 steps. We use the tour's 1e-5 (it grows with lr: ~1e-4
  at lr 1e-2). AdamW barely notices a missing division by the world size (it is
  scale-invariant); the SGD cases catch that.
Between ranks there is no tolerance: an all-reduce hands every rank the same bits, so the
replicas must stay bit-for-bit identical.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.buckets import all_reduce_buckets, make_buckets
from dlcourse.parallel.data.compare import NAMES, VARIANTS, wrap
from dlcourse.parallel.data.steps import average_gradients, shard_batch, train_step
from dlcourse.tour import MATCH_TOLERANCE

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16)  # 7k params, tied
GLOBAL_BATCH = 8
STEPS = 3
CAP_MB = 0.004  # ~4 KB: the tiny GPT splits into several buckets, as a real one would at 25 MB
OPTIMIZERS = {
    "SGD": (lambda params: torch.optim.SGD(params, lr=0.5), 1e-6),
    "AdamW": (lambda params: torch.optim.AdamW(params, lr=1e-3), MATCH_TOLERANCE),
}


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train(model, optimizer_name, micro_batches, steps=STEPS):
    optimizer = OPTIMIZERS[optimizer_name][0](model.parameters())
    for _ in range(steps):
        train_step(model, optimizer, micro_batches, lm_loss)


def reference(optimizer_name, data):
    """One process, the whole batch, the same optimizer steps: what data parallelism must equal."""
    model = GPT(CFG, seed=0)
    train(model, optimizer_name, [data])
    return snapshot(model)


def train_everything():
    """Every variant (torch DDP too) with each optimizer, on full shards and with gradient
    accumulation (2 micro-batches of 1 sequence per rank), in one job: DDP's first use in a
    process imports torch._dynamo, seconds per launch. {(scenario, optimizer): {name: weights}}"""
    group = dist.group.WORLD
    data = synthetic_tokens(GLOBAL_BATCH, CFG, seed=1)
    x, y = shard_batch(data, group)  # (2, T) inputs and targets on each of 4 ranks
    scenarios = {"one batch": [(x, y)], "accumulation": list(zip(x.split(1), y.split(1)))}
    out = {}
    for optimizer_name in OPTIMIZERS:
        for scenario, micro_batches in scenarios.items():
            runs = out[scenario, optimizer_name] = {"reference": reference(optimizer_name, data)}
            for variant in NAMES:
                model = wrap(variant, GPT(CFG, seed=0), group, bucket_cap_mb=CAP_MB)
                train(model, optimizer_name, micro_batches)
                runs[variant] = snapshot(model.module)
    return out


@pytest.fixture(scope="module")
def trained():
    return dlcourse.launch(train_everything, world_size=4, backend="gloo")


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


CASES = [(s, o) for s in ("one batch", "accumulation") for o in OPTIMIZERS]


@pytest.mark.parametrize("scenario, optimizer_name", CASES)
def test_every_variant_equals_one_process_on_the_whole_batch(trained, scenario, optimizer_name):
    runs, tolerance = trained[0][scenario, optimizer_name], OPTIMIZERS[optimizer_name][1]
    for variant in NAMES:
        assert max_diff(runs[variant], runs["reference"]) <= tolerance, variant
    assert max_diff(runs["reference"], snapshot(GPT(CFG, seed=0))) > 100 * tolerance  # it trained


@pytest.mark.parametrize("scenario, optimizer_name", CASES)
def test_from_scratch_variants_equal_torch_ddp(trained, scenario, optimizer_name):
    runs, tolerance = trained[0][scenario, optimizer_name], OPTIMIZERS[optimizer_name][1]
    for variant in VARIANTS:
        assert max_diff(runs[variant], runs["torch DDP"]) <= tolerance, variant


def test_replicas_stay_bit_for_bit_identical(trained):
    for case in CASES:
        for variant in NAMES:
            weights = [ranks[case][variant] for ranks in trained]
            for r in range(1, len(weights)):
                assert all(torch.equal(weights[r][k], weights[0][k]) for k in weights[0]), (
                    f"{case} {variant}: rank {r}'s weights drifted from rank 0's")


def gradients_after(reduce):
    """Each rank's gradients after backward on its shard and then `reduce(model, group)`,
    beside the gradients of one process on the whole batch."""
    group = dist.group.WORLD
    data = synthetic_tokens(GLOBAL_BATCH, CFG, seed=1)
    whole = GPT(CFG, seed=0)
    lm_loss(whole(data[0]), data[1]).backward()
    model = GPT(CFG, seed=0)
    x, y = shard_batch(data, group)
    lm_loss(model(x), y).backward()
    reduce(model, group)
    grads = lambda m: {n: p.grad.clone() for n, p in m.named_parameters()}  # noqa: E731
    return grads(model), grads(whole)


def bucketed(model, group):
    all_reduce_buckets(make_buckets(model, bucket_cap_mb=CAP_MB), group)


@pytest.mark.parametrize("reduce", [average_gradients, bucketed])
def test_averaged_gradients_are_the_whole_batch_gradient(reduce):
    for got, expected in dlcourse.launch(gradients_after, reduce, world_size=4, backend="gloo"):
        assert got.keys() == expected.keys()
        for name in expected:  # rounding of fp32 sums in another order: ~1e-7 relative
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-7,
                                       msg=lambda m: f"{name}: {m}")


def spread_over_ranks(t):
    """Largest difference between ranks of any element of `t`."""
    low, high = t.clone(), t.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return (high - low).max().item()


def gradient_spread_inside_and_after_no_sync():
    group = dist.group.WORLD
    model = wrap("overlapped", GPT(CFG, seed=0), group, bucket_cap_mb=CAP_MB)
    x, y = shard_batch(synthetic_tokens(GLOBAL_BATCH, CFG, seed=1), group)
    with model.no_sync():
        lm_loss(model(x), y).backward()
    inside = spread_over_ranks(model.module.tok_emb.weight.grad)
    lm_loss(model(x), y).backward()  # synchronised: averages the accumulated sum
    return inside, spread_over_ranks(model.module.tok_emb.weight.grad)


def test_no_sync_keeps_gradients_local_until_the_next_synchronised_backward():
    for inside, after in dlcourse.launch(gradient_spread_inside_and_after_no_sync,
                                         world_size=4, backend="gloo"):
        assert inside > 1e-4  # each rank kept its own shard's gradient
        assert after == 0.0  # then one all-reduce made them identical


def test_a_tied_weight_is_one_parameter_in_one_bucket():
    model = GPT(CFG, seed=0)
    assert model.lm_head.weight is model.tok_emb.weight
    listed_twice = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in listed_twice  # a per-module walk would send the matrix twice
    buckets = make_buckets(model, bucket_cap_mb=CAP_MB)
    names = [n for b in buckets for n in b.names]
    assert names.count("tok_emb.weight") == 1 and "lm_head.weight" not in names
    unique_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(b.nbytes for b in buckets) == unique_bytes
