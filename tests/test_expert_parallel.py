"""Lesson 09's proofs on real gloo ranks: the MoE GPT trained K AdamW steps with expert
parallelism (ep = 2 and 4, the EP group being the DP group; dropless and with a capacity
factor; the dispatch from scratch and with torch's all_to_all_single_autograd) equals one
process on the whole batch: losses, aux losses, tokens dropped, the first step's gradients and
every dense and expert parameter after K steps. An expert that gets no token at all in some step
is part of it (asserted to happen). One MoE layer's all-to-all bytes are counted against
k·b·s·h·(ep-1)/ep (uniform routing) and against the rows actually routed (uneven splits);
parameter bytes per rank are experts/ep + dense. Torch's dispatch with grouped-GEMM experts
equals one process in float32 (one step's gradients).

Tolerance: float64 throughout. The ranks add the same numbers as one process in another order
(each expert's weight gradient sums its tokens in (source rank, token) order, the dense ones are
averaged over ranks): ~1e-16 relative. As in lesson 04's proof (tests/test_tensor_parallel_gpt.py)
AdamW's division by sqrt(v) + eps can lift that noise on a (nearly) zero gradient element to
~lr x noise / eps; we allow 1e-11 on weights, 1e-12 on gradients and losses. Forgetting the
/ ep on expert gradients moves the first step's expert gradients by a factor of ep.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.models import MoEConfig, MoEGPT, moe_loss, synthetic_tokens
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.expert import average_gradients, expert_parallel, full_parameters
from dlcourse.parallel.expert.measure import (all_to_all_formula, count_layer, local_param_bytes,
                                              param_bytes, rows_moved)

BASE = dict(vocab_size=32, seq_len=8, n_heads=4, hidden=16, n_experts=8)
CONFIGS = {
    "dropless": MoEConfig(**BASE, top_k=2, n_layers=2),
    # Switch's top-1, capacity below the load: some tokens dropped; block 0 dense, block 1 MoE
    "capacity": MoEConfig(**BASE, top_k=1, n_layers=2, moe_every=2, capacity_factor=0.75),
}
SEED = 3  # dropless: with this seed expert 7 gets no token in the first step (asserted below)
CASES = [("dropless", 2, "scratch"), ("dropless", 4, "scratch"), ("capacity", 2, "scratch"),
         ("capacity", 4, "scratch"), ("dropless", 4, "torch"), ("capacity", 2, "torch")]
BATCH, STEPS, LR = 4, 3, 1e-3  # 4 sequences: 2 per rank at ep = 2, 1 at ep = 4
TOL_WEIGHTS, TOL = 1e-11, 1e-12


def mean_over(value, group):
    t = torch.tensor([float(value)])
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def build(config):
    """The MoEGPT both sides start from. Top-1: expert 7's router row is set to the mean of
    experts 0 and 1's, so its logit lies between theirs and it is never a token's first choice:
    it gets no token in the first step (later steps' updates move the rows apart)."""
    model = MoEGPT(config, seed=SEED)
    if config.top_k == 1:
        with torch.no_grad():
            for moe in model.moe_layers():
                w = moe.router.weight  # (E, h)
                w[7] = (w[0] + w[1]) / 2
    return model


def train_both(config, group, all_to_all):
    """Per step: one process on the whole batch beside expert parallelism on this rank's shard."""
    data = synthetic_tokens(BATCH, config, seed=1)
    reference = build(config)
    model = expert_parallel(reference, group, all_to_all)  # a copy; the reference is left alone
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = shard_batch(data, group)
    out = {"loss": [], "aux": [], "dropped": [], "received": [], "tokens": []}
    for step in range(STEPS):
        opt_ref.zero_grad(), opt.zero_grad()
        want = moe_loss(reference, reference(data[0]), data[1])
        got = moe_loss(model, model(x), y)
        want.backward(), got.backward()
        average_gradients(model, group)
        if step == 0:
            out["grads"] = ({n: p.grad.clone() for n, p in reference.named_parameters()},
                            full_parameters(model, group, grads=True))
        opt_ref.step(), opt.step()
        out["loss"].append((want.item(), mean_over(got.item(), group)))
        out["aux"].append((reference.aux_loss().item(), mean_over(model.aux_loss().item(), group)))
        out["dropped"].append(([m.dropped for m in reference.moe_layers()],
                               [round(mean_over(m.dropped, group) * dist.get_world_size(group))
                                for m in model.moe_layers()]))
        out["received"].append([m.experts.received.clone() for m in model.moe_layers()])
        out["tokens"].append([m.tokens_per_expert.clone() for m in reference.moe_layers()])
    out["weights"] = ({n: p.detach() for n, p in reference.named_parameters()},
                      full_parameters(model, group))
    start = dict(build(config).named_parameters())
    out["moved"] = max((p - start[n]).abs().max().item() for n, p in reference.named_parameters())
    out["params"] = (local_param_bytes(model), param_bytes(config, dist.get_world_size(group), 8))
    return out


def measure_bytes(group):
    """float32, as the lesson measures: one layer, b = 2 sequences of 8 tokens per rank."""
    config = CONFIGS["dropless"]
    out = {}
    for uniform in (True, False):
        records, moe = count_layer(config, 2, group, uniform)
        out[uniform] = (records, rows_moved(moe, group))
    return out


def grouped_gemm_step(group):
    """float32 (F.grouped_mm takes no float64): one step of torch's dispatch with grouped GEMM
    experts beside one process with the loop: (loss, gradients) each."""
    config = CONFIGS["dropless"]
    data = synthetic_tokens(BATCH, config, seed=1)
    reference = build(config)
    model = expert_parallel(reference, group, "torch", grouped_mm=True)
    want = moe_loss(reference, reference(data[0]), data[1])
    want.backward()
    x, y = shard_batch(data, group)
    got = moe_loss(model, model(x), y)
    got.backward()
    average_gradients(model, group)
    return ((want.item(), mean_over(got.item(), group)),
            ({n: p.grad for n, p in reference.named_parameters()},
             full_parameters(model, group, grads=True)))


def everything():
    torch.set_default_dtype(torch.float64)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group
    groups = {4: dist.group.WORLD, 2: pairs[dist.get_rank() // 2]}
    out = {case: train_both(CONFIGS[case[0]], groups[case[1]], case[2]) for case in CASES}
    torch.set_default_dtype(torch.float32)
    out["bytes"] = {ep: measure_bytes(group) for ep, group in groups.items()}
    out["grouped_mm"] = grouped_gemm_step(groups[4])
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(everything, world_size=4, backend="gloo", timeout=120)


def close(got, want, tol, what):
    assert got.keys() == want.keys()
    for name in want:
        error = (got[name] - want[name]).abs().max().item()
        assert error <= tol, f"{what}: {name} off by {error:.1e}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_expert_parallel_training_equals_one_process(results, case):
    for rank, out in enumerate(results):
        r = out[case]
        for key in ("loss", "aux"):
            for step, (want, got) in enumerate(r[key]):
                assert abs(got - want) <= TOL, f"rank {rank} step {step} {key}: {got} vs {want}"
        assert [got == want for want, got in r["dropped"]] == [True] * STEPS
        close(r["grads"][1], r["grads"][0], TOL, f"rank {rank} first step gradient")
        close(r["weights"][1], r["weights"][0], TOL_WEIGHTS, f"rank {rank} weights")
        assert r["moved"] > 1e-4  # it trained: AdamW moved the weights ~lr per step


def test_grouped_gemm_experts_with_torch_dispatch_equal_one_process_in_float32(results):
    # float32: the ranks and the grouped GEMM add in other orders than one process's loop;
    # relative rounding ~1e-7 per sum, 1e-5 relative / 1e-7 absolute leaves a margin of ~100.
    for out in results:
        (want, got), (want_grads, got_grads) = out["grouped_mm"]
        assert abs(got - want) <= 1e-5 * abs(want)
        assert got_grads.keys() == want_grads.keys()
        for name in want_grads:
            assert torch.allclose(got_grads[name], want_grads[name], rtol=1e-5, atol=1e-7), name


def test_capacity_drops_tokens_and_dropless_drops_none(results):
    out = results[0]
    assert all(sum(want) > 0 for want, _ in out["capacity", 2, "scratch"]["dropped"])
    assert all(sum(want) == 0 for want, _ in out["dropless", 2, "scratch"]["dropped"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_some_rank_had_an_expert_with_no_tokens(results, case):
    """The proof covers the edge: an expert that no rank sent a token to in some step (its rank
    runs it on an empty (0, h) block and gets a zero gradient, as one process does)."""
    first_step = [received for out in results for received in out[case]["received"][0]]
    assert any((received.sum(dim=0) == 0).any() for received in first_step), \
        "no expert went without tokens: the edge case was not exercised"
    ep = case[1]  # the received counts are the one-process tokens per expert, block by block
    for rank, out in enumerate(results):
        for received, tokens in zip(out[case]["received"], out[case]["tokens"]):
            for got, want in zip(received, tokens):
                block = rank % ep
                assert torch.equal(got.sum(dim=0), want.view(ep, -1)[block])


@pytest.mark.parametrize("ep", [2, 4])
def test_all_to_all_bytes_under_uniform_routing_are_the_formula(results, ep):
    config, b, itemsize = CONFIGS["dropless"], 2, 4
    rows = config.top_k * b * config.seq_len  # k·b·s rows each way
    for out in results:
        records, moved = out["bytes"][ep][True]
        assert moved == {"dispatch": rows, "combine": rows, "own": rows // ep}
        E, k, data = config.n_experts, config.top_k, rows * config.hidden * itemsize
        # forward: the (k, E) int64 counts all-gathered (capacity, aux loss), the E counts
        # all-to-all, then dispatch and combine; backward: the reverse of the last two
        assert [(r.op, r.nbytes) for r in records["forward"]] == [
            ("all_gather", ep * k * E * 8), ("all_to_all", E * 8),
            ("all_to_all", data), ("all_to_all", data)]
        assert [(r.op, r.nbytes) for r in records["backward"]] == [("all_to_all", data)] * 2
        for phase in ("forward", "backward"):
            a2a = records[phase][-2:]
            assert [r.bus_bytes() for r in a2a] == [all_to_all_formula(config, b, ep)] * 2
            # what really leaves the rank: the rows not sent to its own experts
            assert (rows - moved["own"]) * config.hidden * itemsize == a2a[0].bus_bytes()


@pytest.mark.parametrize("ep", [2, 4])
def test_all_to_all_bytes_with_uneven_splits_are_the_rows_routed(results, ep):
    h, itemsize = CONFIGS["dropless"].hidden, 4
    uneven = False
    for out in results:
        records, moved = out["bytes"][ep][False]
        fwd = [r.nbytes for r in records["forward"] if r.op == "all_to_all"][1:]  # after counts
        bwd = [r.nbytes for r in records["backward"]]
        # forward: dispatch sends M rows, combine sends back the R received; backward reversed
        assert fwd == [moved["dispatch"] * h * itemsize, moved["combine"] * h * itemsize]
        assert bwd == [moved["dispatch"] * h * itemsize, moved["combine"] * h * itemsize]
        uneven |= moved["combine"] != moved["dispatch"]
    assert uneven  # some rank received more rows than it sent: the splits really were uneven


@pytest.mark.parametrize("case", [("dropless", 2, "scratch"), ("capacity", 4, "scratch")],
                         ids=lambda c: "-".join(map(str, c)))
def test_parameter_bytes_per_rank_are_experts_over_ep_plus_dense(results, case):
    for out in results:
        measured, formula = out[case]["params"]
        assert measured == formula
