"""Lesson 09's MoE layer in one process (`dlcourse/moe.py`), each piece against an independent
reference written as the papers state it (loops over tokens and experts): top-k routing with
renormalised weights, the capacity queue, the stable permutation, Switch's load-balance loss, the
layer's output; the grouped GEMM against the loop; bad configs refused with the arithmetic.
Float64 for the exact comparisons; the grouped GEMM takes float32 only (see its test)."""

import math

import pytest
import torch
import torch.nn.functional as F

from dlcourse.models import GPT, GPTConfig, MoEConfig, MoEGPT, moe_loss, synthetic_tokens
from dlcourse.moe import (Experts, MoE, capacity, keep_mask, load_balance_loss, one_process_counts,
                          permute, route, slot_counts)
from dlcourse.parallel.expert import check_ep

CFG = MoEConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16, n_experts=8, top_k=2)


def draw(n_tokens=24, n_experts=6, k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_tokens, n_experts, generator=gen, dtype=torch.float64), k


def test_route_picks_the_k_largest_and_renormalises():
    logits, k = draw()
    probs, weights, experts = route(logits, k)
    for n in range(logits.size(0)):
        p = torch.softmax(logits[n], dim=0)
        ranked = sorted(range(p.numel()), key=lambda e: -p[e].item())[:k]
        assert experts[n].tolist() == ranked
        chosen = torch.stack([p[e] for e in ranked])
        assert torch.allclose(weights[n], chosen / chosen.sum(), rtol=0, atol=1e-15)
    assert torch.allclose(weights.sum(dim=1), torch.ones(logits.size(0), dtype=torch.float64))


def queue_reference(experts, cap, n_experts):
    """Every first choice in token order, then every second choice, ...: GShard's filling."""
    keep = torch.zeros_like(experts, dtype=torch.bool)
    filled = [0] * n_experts
    for j in range(experts.size(1)):
        for n in range(experts.size(0)):
            e = experts[n, j].item()
            if filled[e] < cap:
                keep[n, j], filled[e] = True, filled[e] + 1
    return keep


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_capacity_queue_is_the_same_however_the_batch_is_split(shards):
    logits, k = draw(n_tokens=32, n_experts=4, k=2, seed=3)
    logits[:, 0] += 1.5  # expert 0 popular: it overflows
    _, _, experts = route(logits, k)
    cap = capacity(0.75, 32, k, 4)
    want = queue_reference(experts, cap, 4)
    assert 0 < (~want).sum() < want.numel()  # some dropped, some kept
    parts = experts.chunk(shards)  # rank r holds consecutive tokens, as shard_batch
    counts = [slot_counts(p, 4) for p in parts]  # (k, E) per rank
    got = torch.cat([keep_mask(p, sum(counts[:r], torch.zeros_like(counts[0])), sum(counts), cap)
                     for r, p in enumerate(parts)])
    assert torch.equal(got, want)


def test_permute_groups_by_expert_keeping_token_order_and_drops_what_is_not_kept():
    logits, k = draw(n_tokens=20, n_experts=5)
    _, _, experts = route(logits, k)
    keep = torch.rand(experts.shape, generator=torch.Generator().manual_seed(1)) < 0.8
    order, counts = permute(experts, keep, 5)
    want = [n * k + j for e in range(5) for n in range(20) for j in range(k)
            if experts[n, j] == e and keep[n, j]]
    assert order.tolist() == want
    assert counts.tolist() == [sum(1 for a in want if experts.flatten()[a] == e) for e in range(5)]


def test_load_balance_loss_is_switch_eq_4_with_top_k():
    logits, k = draw(n_tokens=30, n_experts=6, k=2)
    probs, _, experts = route(logits, k)
    N, E = probs.shape
    f = [sum(int(experts[n, j] == e) for n in range(N) for j in range(k)) / (k * N)
         for e in range(E)]
    P = [sum(probs[n, e].item() for n in range(N)) / N for e in range(E)]
    want = E * sum(fe * pe for fe, pe in zip(f, P))
    got = load_balance_loss(probs, slot_counts(experts, E).sum(dim=0))
    assert abs(got.item() - want) < 1e-14
    uniform = load_balance_loss(torch.full((4, E), 1 / E, dtype=torch.float64),
                                torch.full((E,), 3))
    assert abs(uniform.item() - 1.0) < 1e-15  # balanced routing: 1, its minimum


@pytest.mark.parametrize("capacity_factor", [None, 0.5])
def test_moe_layer_equals_a_loop_over_tokens(capacity_factor):
    torch.manual_seed(0)
    config = MoEConfig(**{**CFG.__dict__, "capacity_factor": capacity_factor})
    moe = MoE(config).double()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    got = moe(x).view(16, 16)
    flat = x.view(16, 16)
    probs, weights, experts = route(moe.router(flat), config.top_k)
    cap = capacity(capacity_factor, 16, config.top_k, 8) if capacity_factor else 10**9
    keep = queue_reference(experts, cap, 8)
    fc, proj = moe.experts.fc, moe.experts.proj
    for n in range(16):
        want = torch.zeros(16, dtype=torch.float64)
        for j in range(config.top_k):
            e = experts[n, j]
            if keep[n, j]:
                hidden = F.gelu(fc.weight[e] @ flat[n] + fc.bias[e])
                want += weights[n, j] * (proj.weight[e] @ hidden + proj.bias[e])
        assert torch.allclose(got[n], want, rtol=0, atol=1e-14), n
    assert moe.dropped == int((~keep).sum()) and (moe.dropped > 0) == bool(capacity_factor)


def test_grouped_gemm_equals_the_expert_loop_in_float32():
    # torch 2.13 CPU: F.grouped_mm takes float32/bf16/fp16 (not float64) and rows 16-byte
    # aligned. Tolerance: two float32 matmul orders over 16- and 64-long dot products, ~1e-6.
    torch.manual_seed(0)
    experts = Experts(4, 16, 64)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.2)
    counts = torch.tensor([5, 0, 9, 2])  # an expert with no tokens
    x = torch.randn(16, 16, requires_grad=True)
    grad = torch.randn(16, 16)
    results = []
    for grouped in (False, True):
        experts.grouped_mm = grouped
        experts.zero_grad()
        x.grad = None
        y = experts(x, counts)
        y.backward(grad)
        results.append([y.detach(), x.grad] + [p.grad.clone() for p in experts.parameters()])
    for loop, gemm in zip(*results):
        assert torch.allclose(loop, gemm, rtol=1e-5, atol=1e-6)
    experts.grouped_mm = True
    with pytest.raises(ValueError, match="float64"):
        experts(x.double(), counts)


def test_moe_gpt_trains_on_its_loss_and_leaves_the_dense_gpt_alone():
    model = MoEGPT(CFG, seed=0)
    x, y = synthetic_tokens(4, CFG, seed=1)
    loss = moe_loss(model, model(x), y)
    aux = model.aux_loss()
    assert len(model.moe_layers()) == 2 and 2.0 <= aux.item() < 2.5  # ~1 per layer at init
    loss.backward()
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0  # the router learns
    dense = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16)
    a, b = GPT(dense, seed=0), GPT(dense, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    mixed = MoEGPT(MoEConfig(**{**CFG.__dict__, "n_layers": 3, "moe_every": 2}))
    assert [type(b.mlp).__name__ for b in mixed.blocks] == ["MLPBlock", "MoE", "MLPBlock"]


@pytest.mark.parametrize("change, message", [
    (dict(n_experts=4, top_k=5), r"top_k 5 > n_experts 4"),
    (dict(capacity_factor=0.0), r"capacity_factor must be > 0"),
    (dict(capacity_factor=-1.0), r"capacity_factor must be > 0"),
    (dict(n_experts=0), r"n_experts must be a whole number >= 1"),
])
def test_bad_moe_configs_are_refused_with_the_arithmetic(change, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(**{**CFG.__dict__, **change})


def test_ep_that_does_not_divide_the_experts_is_refused():
    with pytest.raises(ValueError, match=r"ep 3 does not divide n_experts 8 \(8 / 3 = 2.66667\)"):
        check_ep(CFG, 3)
    check_ep(CFG, 4)


def test_one_process_counts_are_the_batch_and_nothing_before():
    counts = torch.tensor([[1, 2], [3, 0]])
    batch, before = one_process_counts(counts)
    assert torch.equal(batch, counts) and not before.any()
    assert capacity(1.25, 32, 2, 8) == math.ceil(1.25 * 2 * 32 / 8)


def test_active_parameters_are_dense_plus_k_of_e_experts_counted_on_the_model():
    from dlcourse.parallel.expert.measure import params_per_token
    config = MoEConfig(**{**CFG.__dict__, "n_layers": 3, "moe_every": 2, "expert_hidden": 24})
    model = MoEGPT(config)
    experts = [p for m in model.moe_layers() for p in m.experts.parameters()]
    expert_values = sum(p.numel() for p in experts)
    total = sum(p.numel() for p in model.parameters())
    got = params_per_token(config)
    assert got == {"total": total,
                   "active": total - expert_values + expert_values * config.top_k // 8}
    assert got["active"] < got["total"]


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_of_the_dense_mlp_moves_one_ring_all_reduce_of_lesson_04s_count(tp):
    from dlcourse.collectives.counter import CommRecord
    from dlcourse.parallel.tensor.measure import layer_formula
    from dlcourse.parallel.expert.measure import all_to_all_formula, tp_mlp_bytes
    (op, elements), calls = next(iter(layer_formula(CFG, 2, tp)["forward"].items()))
    assert calls == 2  # lesson 04: attention's g and the MLP's g; the MLP's is one of them
    assert tp_mlp_bytes(CFG, 2, tp) == CommRecord(op, elements * 4, tp).bus_bytes()
    ep_bytes = 2 * all_to_all_formula(CFG, 2, tp)  # dispatch + combine, forward
    assert ep_bytes == pytest.approx(CFG.top_k * tp_mlp_bytes(CFG, 2, tp))
    # one batch of 2·tp sequences over tp ranks: every TP rank holds all of it, an EP rank 2
    assert ep_bytes == pytest.approx(CFG.top_k / tp * tp_mlp_bytes(CFG, 2 * tp, tp))


def test_routing_history_counts_every_assignment_once_per_step():
    from dlcourse.parallel.expert.measure import routing_history
    config = MoEConfig(**{**CFG.__dict__, "capacity_factor": 0.5})
    data = synthetic_tokens(2, config, seed=1)
    history = routing_history(config, data, steps=3)
    n_assignments = 2 * config.seq_len * config.top_k
    assert history["tokens"].shape == (3, 2, 8)
    # kept + dropped = k·N in every step and block; with capacity 0.5 some are dropped
    assert torch.equal(history["tokens"].sum(dim=2) + history["dropped"],
                       torch.full((3, 2), n_assignments))
    assert history["dropped"].sum() > 0
    assert history["tokens"].max() <= capacity(0.5, 2 * config.seq_len, config.top_k, 8)


def test_grouped_gemm_on_widths_it_cannot_take_is_refused_before_ranks_start():
    with pytest.raises(ValueError, match=r"expert width 20 is not a multiple of 8"):
        check_ep(MoEConfig(**{**CFG.__dict__, "expert_hidden": 20}), 2, grouped_mm=True)
    with pytest.raises(ValueError, match=r"unknown all_to_all 'nccl'"):
        check_ep(CFG, 2, all_to_all="nccl")
    check_ep(CFG, 2, all_to_all="torch", grouped_mm=True)


def test_pad_groups_puts_every_row_in_its_groups_padded_block_in_order():
    from dlcourse.moe_experts import pad_groups
    counts = torch.tensor([5, 0, 9, 8, 1])
    padded, rows = pad_groups(counts, 8)
    assert padded.tolist() == [8, 8, 16, 8, 8]  # a multiple of 8, at least 8 (empty: 8 zero rows)
    ends = padded.cumsum(0)
    for e, piece in enumerate(rows.split(counts.tolist())):  # rows of group e, in order
        start = int(ends[e] - padded[e])
        assert piece.tolist() == list(range(start, start + int(counts[e])))


def test_grouped_gemm_takes_groups_as_routed_and_pads_only_when_asked(monkeypatch):
    # torch 2.13's plain grouped GEMM takes any group sizes (`GroupedLinear`'s docstring), so
    # the offsets handed to it are the routed counts' ends, the empty group included; with
    # `align` (what an FP8 kernel would need) every group is a multiple of it, at least it,
    # and the result is the same to float32 rounding, forward and backward.
    real, seen = F.grouped_mm, []

    def recording(a, b, *, offs=None, **kw):
        seen.append(offs.clone())
        return real(a, b, offs=offs, **kw)

    monkeypatch.setattr(F, "grouped_mm", recording)
    counts = torch.tensor([5, 0, 9, 2])
    x = torch.randn(16, 16)
    results = []
    for align in (None, 16):
        experts = Experts(4, 16, 64, grouped_mm=True)
        torch.manual_seed(0)
        for layer in (experts.fc, experts.proj):
            layer.align = align
            for p in layer.parameters():
                torch.nn.init.normal_(p, std=0.2)
        xg = x.clone().requires_grad_()
        y = experts(xg, counts)
        y.backward(torch.ones_like(y))
        results.append([y, xg.grad, experts.fc.weight.grad, experts.proj.weight.grad])
    assert len(seen) == 4  # fc and proj, twice
    assert [o.tolist() for o in seen[:2]] == [[5, 5, 14, 16]] * 2
    for offs in seen[2:]:
        sizes = torch.diff(offs, prepend=offs.new_zeros(1))
        assert (sizes % 16 == 0).all() and (sizes >= 16).all(), sizes.tolist()
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_gemms_of_forward_and_backward_are_in_layouts_cudas_kernel_does_not_check():
    # GroupedLinear's docstring: torch's CUTLASS kernel (GroupMMCommon.cuh) checks group sizes
    # only for a column-major 2-D left operand against a 3-D right one, or in a 2-D x 2-D
    # product not (column-major, row-major). Log what autograd hands the op, forward and back.
    from torch.utils._python_dispatch import TorchDispatchMode

    def row_major(t):
        return t.stride(-1) == 1

    seen = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._grouped_mm.default:
                seen.append((args[0].dim(), row_major(args[0]), args[1].dim(),
                             row_major(args[1])))
            return func(*args, **(kwargs or {}))

    experts = Experts(4, 16, 64, grouped_mm=True)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(16, 16, requires_grad=True)
    with Log():
        experts(x, torch.tensor([5, 0, 9, 2])).sum().backward()
    assert len(seen) == 6  # 2 layers: forward, input gradient, weight gradient
    for a_dim, a_row, b_dim, b_row in seen:
        if b_dim == 3:
            assert a_dim == 2 and a_row  # the rows (M, d) row-major: no check on M
        else:
            assert (a_dim, a_row, b_row) == (2, False, True)  # gradᵀ · x: empty groups allowed
