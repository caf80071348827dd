"""Lesson 08's attention pieces, proven: the online-softmax merge and the blockwise attention
against torch's `scaled_dot_product_attention` in one process; ring (contiguous and zig-zag,
each block written out and on torch's fused CPU kernel), Ulysses and all-gather-KV attention
on real gloo ranks (cp = 2 and 4, causal and not), output and the gradients of q, k and v equal
to one process's attention on the whole sequence; each rank's causal work, largest tensor and
one layer's messages beside the formulas; bad input refused.

Tolerance: float64. The methods add the same products as one process in another order (blocks
merged by rescaling), ~1e-16 relative per operation; measured at most 3e-15 on values of order 1.
We allow 1e-12. A merge that forgets to rescale, or a mask at the wrong offset, is off by ~1e-1.
"""

import math
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

import dlcourse
from conftest import needs_gpu
from dlcourse.collectives.p2p import ring_neighbours
from dlcourse.models import GPTConfig
from dlcourse.parallel.context import (METHODS, Layout, attention_block, block_attention,
                                       causal_work, check_cp, merge, ring_attention)
from dlcourse.parallel.context.kernels import KERNELS
from dlcourse.parallel.context.measure import (as_counter, block_to_hide, count_layer,
                                               layer_bytes_sent, layer_formula, ring_step,
                                               sent_bytes)

TOL = 1e-12
B, A, S, D = 2, 4, 16, 4  # batch, heads, whole sequence, head dim
CFG = GPTConfig(vocab_size=32, seq_len=16, n_layers=1, n_heads=4, hidden=16)


def qkv_and_grad(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, A, S, D, generator=gen, dtype=torch.float64) for _ in range(4)]


# ---------------------------------------------------------------- one process


def test_merging_two_key_blocks_equals_attention_over_all_keys():
    q, k, v, _ = qkv_and_grad()
    pos = torch.arange(S)
    halves = [(k[:, :, i], v[:, :, i], pos[i]) for i in (slice(0, 5), slice(5, S))]
    (o1, l1), (o2, l2) = (attention_block(q, kk, vv, pos, p, False) for kk, vv, p in halves)
    out, lse = merge(o1, l1, o2, l2)
    want = F.scaled_dot_product_attention(q, k, v)
    assert (out - want).abs().max() < TOL
    assert (lse - torch.logsumexp(q @ k.transpose(-2, -1) / math.sqrt(D), -1)).abs().max() < TOL
    unscaled = (o1 + o2) / 2  # the wrong merge: no rescaling by each block's share
    assert (unscaled - want).abs().max() > 1e-2


def test_block_attention_with_global_offsets_matches_sdpa_with_its_mask():
    q, k, v, dout = qkv_and_grad(1)
    q_pos, k_pos = torch.arange(8, 12), torch.arange(S)  # queries 8..11 of the sequence
    mask = q_pos[:, None] >= k_pos[None, :]
    qs = q[:, :, 8:12].clone().requires_grad_()
    ks, vs = k.clone().requires_grad_(), v.clone().requires_grad_()
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (qs, ks, vs))
    out = block_attention(qs, ks, vs, q_pos, k_pos, causal=True)
    want = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask)
    out.backward(dout[:, :, :4])
    want.backward(dout[:, :, :4])
    assert (out - want).abs().max() < TOL
    for got, ref in ((qs, qr), (ks, kr), (vs, vr)):
        assert (got.grad - ref.grad).abs().max() < TOL
    local_mask = block_attention(qs, ks, vs, torch.arange(4), k_pos, causal=True)  # offset 0
    assert (local_mask - want).abs().max() > 1e-2


def test_the_fused_kernel_refuses_a_mask_it_cannot_express():
    q, k, v, _ = qkv_and_grad()
    with pytest.raises(ValueError, match="aligned diagonal"):
        KERNELS["fused"][0](q, k, v, torch.arange(S) + 1, torch.arange(S), True)
    out, lse = KERNELS["fused"][0](q, k, v, torch.arange(S), torch.arange(S), True)
    assert (out - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() < TOL


@needs_gpu
@pytest.mark.gpu
def test_block_attention_on_a_gpu_matches_sdpa_there():
    """The positions and masks follow q to its device (no CPU tensor meets a CUDA one)."""
    q, k, v, dout = (t.cuda() for t in qkv_and_grad(2))
    q_pos, k_pos = torch.arange(8, 12, device="cuda"), torch.arange(S, device="cuda")
    mine = [q[:, :, 8:12].clone().requires_grad_(), k.clone().requires_grad_(),
            v.clone().requires_grad_()]
    ref = [t.detach().clone().requires_grad_() for t in mine]
    out = block_attention(*mine, q_pos, k_pos, causal=True)
    want = F.scaled_dot_product_attention(*ref, attn_mask=q_pos[:, None] >= k_pos[None, :])
    out.backward(dout[:, :, :4])
    want.backward(dout[:, :, :4])
    assert (out - want).abs().max() < TOL
    assert all((m.grad - r.grad).abs().max() < TOL for m, r in zip(mine, ref))


@pytest.mark.parametrize("name", ["contiguous", "zigzag"])
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shards_hold_the_layouts_positions_and_unshard_back(name, cp):
    layout = Layout(name, cp, S)
    x = torch.arange(S).repeat(3, 1)  # (3, S): each token's value is its position
    shards = [layout.shard(x, r) for r in range(cp)]
    for r, shard in enumerate(shards):
        assert shard.tolist() == [layout.positions(r).tolist()] * 3
    assert torch.equal(layout.unshard(shards), x)
    held = sorted(p for r in range(cp) for p in layout.positions(r).tolist())
    assert held == list(range(S))  # every token on exactly one rank


def test_zigzag_rank_i_holds_chunks_i_and_2cp_minus_1_minus_i():
    layout = Layout("zigzag", 4, 16)
    assert [layout.chunks(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert layout.positions(1).tolist() == [2, 3, 12, 13]


@pytest.mark.parametrize("cp, s", [(2, 8), (4, 16), (3, 24)])
def test_zigzag_is_torchs_head_tail_load_balancer(cp, s):
    balancer = pytest.importorskip(
        "torch.distributed.tensor.experimental._context_parallel._load_balancer",
        reason="torch's context-parallel load balancer is private and recent (2.13 has it)")
    torch_order = balancer._HeadTailLoadBalancer(s, cp, "cpu")._generate_indices()[0]
    layout = Layout("zigzag", cp, s)
    ours = torch.cat([layout.positions(r) for r in range(cp)])  # rank 0's tokens, then rank 1's
    assert ours.tolist() == torch_order.tolist()


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_causal_work_contiguous_grows_with_rank_zigzag_is_even(cp):
    assert causal_work(Layout("contiguous", cp, 16 * cp)) == [r + 1 for r in range(cp)]
    assert causal_work(Layout("zigzag", cp, 16 * cp)) == [2 * cp + 1] * cp


@pytest.mark.parametrize("config, cp, method, says", [
    (CFG, 3, "ring", "16 / 3 = 5.33333"),
    (GPTConfig(seq_len=12), 4, "zigzag", "12 / 8 = 1.5"),
    (GPTConfig(seq_len=24, n_heads=4, hidden=16), 3, "ulysses", "4 / 3 = 1.33333"),
    (CFG, 2, "spiral", "unknown context-parallel method"),
    (GPTConfig(dropout=0.1), 2, "ring", "dropout 0"),
])
def test_bad_input_is_refused_with_the_arithmetic(config, cp, method, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        check_cp(config, cp, method)


@pytest.mark.parametrize("cp, method", [(8, "zigzag"), (16, "ring"), (4, "ulysses"), (1, "ring")])
def test_what_divides_is_accepted(cp, method):
    check_cp(CFG, cp, method)  # 16 tokens in 2·8 or 16 chunks; 4 heads over 4 ranks


# ---------------------------------------------------------------- on ranks


def attention_errors(group, method, causal, **kernel):
    """Max |parallel - one process| of the output and of dq, dk, dv on this rank."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    q, k, v, dout = qkv_and_grad(cp)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, is_causal=causal)
    want.backward(dout)
    layout = Layout(METHODS[method][0], cp, S)
    mine = [layout.shard(t, rank, dim=2).requires_grad_() for t in (q, k, v)]
    out = METHODS[method][1](*mine, group, layout, causal, **kernel)
    out.backward(layout.shard(dout, rank, dim=2))
    errors = [(out - layout.shard(want.detach(), rank, dim=2)).abs().max().item()]
    errors += [(m.grad - layout.shard(f.grad, rank, dim=2)).abs().max().item()
               for m, f in zip(mine, full)]
    return errors


def ring_flops(group, layout):
    """Multiply-add flops this rank's ring attention forward does, counted by torch."""
    q, k, v, _ = (layout.shard(t, dist.get_rank(group), dim=2) for t in qkv_and_grad())
    with FlopCounterMode(display=False) as flops:
        ring_attention(q, k, v, group, layout, causal=True)
    return flops.get_total_flops()


class LargestTensor(TorchDispatchMode):
    """Records the most elements any operator's output has while the `with` block runs."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.largest = max([self.largest, *sizes])
        return out


def largest_tensor(group, method, s=64):
    """The largest tensor made by this rank's attention forward and backward over s tokens."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    gen = torch.Generator().manual_seed(0)
    layout = Layout(METHODS[method][0], cp, s)
    q, k, v = (layout.shard(torch.randn(B, A, s, D, generator=gen), rank, dim=2).requires_grad_()
               for _ in range(3))
    with LargestTensor() as mode:
        METHODS[method][1](q, k, v, group, layout, True).sum().backward()
    return mode.largest


def everything():
    torch.set_default_dtype(torch.float64)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    groups = {2: pairs[dist.get_rank() // 2], 4: dist.group.WORLD}
    out = {}
    for cp, group in groups.items():
        for method in METHODS:
            for causal in (False, True):
                out["attention", cp, method, causal] = attention_errors(group, method, causal)
                if method in ("ring", "zigzag"):  # the same ring on torch's fused CPU kernel
                    out["attention", cp, method + " fused", causal] = attention_errors(
                        group, method, causal, kernel="fused")
        for name in ("contiguous", "zigzag"):
            out["flops", cp, name] = ring_flops(group, Layout(name, cp, S))
        for method in METHODS:
            out["largest", cp, method] = largest_tensor(group, method)
    torch.set_default_dtype(torch.float32)
    for cp, group in groups.items():
        right, left = (dist.get_group_rank(group, r) for r in ring_neighbours(
            dist.get_rank(group), cp, group))
        for method in METHODS:
            records = count_layer(CFG, B, group, method)
            out["comm", cp, method] = {k: as_counter(v) for k, v in records.items()}
            out["sent", cp, method] = sum(sent_bytes(v) for v in records.values())
            out["peers", cp, method] = {(r.op, r.peer) for v in records.values() for r in v
                                        if r.op in ("send", "recv")}
        out["neighbours", cp] = {("send", right), ("recv", left)}
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(everything, world_size=4, backend="gloo")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("method", [*METHODS, "ring fused", "zigzag fused"])
@pytest.mark.parametrize("cp", [2, 4])
def test_attention_and_its_gradients_equal_one_process(results, cp, method, causal):
    for rank, out in enumerate(results):
        output, dq, dk, dv = out["attention", cp, method, causal]
        for what, error in (("output", output), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert error <= TOL, f"rank {rank}, cp {cp}, {method}: {what} off by {error:.1e}"


@pytest.mark.parametrize("cp", [2, 4])
def test_each_ranks_causal_flops_are_its_block_pairs(results, cp):
    """Two matmuls (q kᵀ, p v) of 2·b·a·c²·d flops per computed pair of chunks of c tokens."""
    for name in ("contiguous", "zigzag"):
        layout = Layout(name, cp, S)
        per_pair = 2 * 2 * B * A * layout.chunk_len ** 2 * D
        measured = [out["flops", cp, name] for out in results[:cp]]
        assert measured == [pairs * per_pair for pairs in causal_work(layout)]
    contiguous = [out["flops", cp, "contiguous"] for out in results[:cp]]
    assert contiguous[-1] == cp * contiguous[0]  # the imbalance zig-zag removes


@pytest.mark.parametrize("cp", [2, 4])
def test_no_rank_holds_an_s_by_s_score_matrix(results, cp):
    """The ring's largest tensor is one block of scores, b·a·(s/cp)²; all-gather-KV's is its
    queries against every key, b·a·(s/cp)·s; Ulysses' is whole sequences for a/cp heads,
    b·(a/cp)·s² (here materialised: a fused kernel would not); none is b·a·s²."""
    s = 64
    for out in results:
        assert out["largest", cp, "ring"] == B * A * (s // cp) ** 2
        assert out["largest", cp, "zigzag"] <= B * A * (s // cp) ** 2
        assert out["largest", cp, "allgather"] == B * A * (s // cp) * s
        assert out["largest", cp, "ulysses"] == B * (A // cp) * s * s


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("cp", [2, 4])
def test_one_layer_sends_what_the_formula_says(results, cp, method):
    for out in results:
        assert out["comm", cp, method] == layer_formula(CFG, B, cp, method)
        assert out["sent", cp, method] == pytest.approx(layer_bytes_sent(CFG, B, cp, method),
                                                         rel=1e-12)


@pytest.mark.parametrize("cp", [2, 4])
def test_the_ring_sends_right_and_receives_from_the_left(results, cp):
    for method in ("ring", "zigzag"):
        for out in results:
            assert out["peers", cp, method] == out["neighbours", cp]


# ---------------------------------------------------------------- ring step: compute vs message


def test_ring_step_counts_the_flops_torch_counts_and_the_bytes_of_one_message():
    b, a, c, d = 2, 4, 8, 4
    q, k, v = (torch.randn(b, a, c, d) for _ in range(3))
    with FlopCounterMode(display=False) as flops:
        attention_block(q, k, v, torch.arange(c), torch.arange(c), causal=False)
    step = ring_step(b, c, a * d)
    assert step["flops"] == flops.get_total_flops()
    assert step["bytes"] == torch.stack([k, v]).nbytes  # the message ring.py sends


@pytest.mark.parametrize("alpha, beta", [(0.0, 1.234e-9), (1e-5, 1e-9), (5e-5, 4e-10)])
def test_block_to_hide_is_the_shortest_block_whose_compute_covers_its_message(alpha, beta):
    b, h, flops_per_s = 1, 512, 1e11

    def hidden(c):
        step = ring_step(b, c, h)
        return step["flops"] / flops_per_s >= alpha + step["bytes"] * beta

    c = block_to_hide(b, h, flops_per_s, alpha, beta)
    assert hidden(c) and not hidden(c - 1)
    if alpha == 0:  # then c = F·e·beta/2: no b, no h
        assert c == math.ceil(flops_per_s * 4 * beta / 2)
