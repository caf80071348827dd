"""Lesson 04's "what real models need", on real gloo ranks against single-process torch in float64:
grouped-query attention with fewer KV heads than ranks (KV heads replicated), the padded
vocabulary (masked padding leaves the loss exactly the unpadded one), the RNG tracker (dropout
masks agree across the tp ranks on the default stream, differ inside fork), and one coalesced
all-reduce of the sequence-parallel partial gradients instead of one per parameter. Also the
per-layer FLOPs and bytes of `cost.py` against torch's FlopCounterMode and lesson 02's CommCounter,
and three facts the lesson states: Table 2's unsplit floor (10·sbh in 16 bit, 16·sbh in float32
without masks), g_trap in a residual model (exactly tp x only inside the last branch), and DTensor
summing each Partial LayerNorm gradient at each of CPU AdamW's 3 reads.

One launch of 4 ranks runs every case: tp = 4 on the whole job, tp = 2 on RankGrid(dp=2, tp=2).
Tolerance: float64, sums over 2 or 4 ranks in another order than one matmul: ~1e-16 relative, so
1e-12 (a missing all-reduce is off by O(1)).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import dlcourse
from dlcourse.collectives.counter import CommCounter
from dlcourse.models import GPT, Block, GPTConfig, synthetic_tokens
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor import parallelize, vocab_parallel_cross_entropy, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.cost import comm_compute_ratio, layer_comm_bytes, layer_flops
from dlcourse.parallel.tensor.gqa import GroupedQueryAttention, TensorParallelGQA, kv_heads_of_rank
from dlcourse.parallel.tensor.grads import all_reduce_sequence_partial_grads
from dlcourse.parallel.tensor.measure import count_layer
from dlcourse.parallel.tensor.rng import seed_tensor_parallel
from dlcourse.parallel.tensor.vocab import mask_padded_logits, padded_vocab_size

TOL = 1e-12
H, HEADS, T, B = 32, 8, 8, 2


def err(a, b):
    return (a - b).abs().max().item()


def gqa(group, n_kv):
    """TensorParallelGQA vs GroupedQueryAttention: output, input grad, every weight's grad (each
    rank's rows of q, k, v and columns of proj against the plain gradient's)."""
    torch.manual_seed(0)
    plain = GroupedQueryAttention(H, HEADS, n_kv).double()
    mine = TensorParallelGQA(plain, group)
    x = torch.randn(B, T, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = plain(x_ref), mine(x_tp)
    want.pow(2).sum().backward()
    got.pow(2).sum().backward()
    t, rank, d = dist.get_world_size(group), dist.get_rank(group), H // HEADS
    q_rows = slice(rank * HEADS // t * d, (rank + 1) * HEADS // t * d)
    kv_rows = slice(mine.kv_heads.start * d, mine.kv_heads.stop * d)
    return {"output": err(got, want), "input grad": err(x_tp.grad, x_ref.grad),
            "q grad": err(mine.q.grad, plain.q.weight.grad[q_rows]),
            "k grad": err(mine.k.grad, plain.k.weight.grad[kv_rows]),
            "v grad": err(mine.v.grad, plain.v.weight.grad[kv_rows]),
            "proj grad": err(mine.proj.grad, plain.proj.weight.grad[:, q_rows])}


def padded_loss(group):
    """V = 100 padded to a multiple of 8·t: the masked padded logits give F.cross_entropy's loss
    and gradient on the 100 real ids; left unmasked they change the loss."""
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    V = 100
    V_pad = padded_vocab_size(V, t, divisible_by=8)
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(B * T, V_pad, dtype=torch.float64, generator=gen)
    targets = torch.randint(0, V, (B * T,), generator=gen)
    whole = logits[:, :V].clone().requires_grad_()
    mine = logits.chunk(t, dim=1)[rank].clone().requires_grad_()  # (N, V_pad/t)
    got = vocab_parallel_cross_entropy(mask_padded_logits(mine, rank * mine.size(1), V), targets, group)
    want = F.cross_entropy(whole, targets)
    got.backward()
    want.backward()
    grad_pad = torch.cat([whole.grad, torch.zeros(B * T, V_pad - V, dtype=torch.float64)], dim=1)
    unmasked = vocab_parallel_cross_entropy(mine.detach(), targets, group)
    return {"loss": err(got, want), "grad": err(mine.grad, grad_pad.chunk(t, dim=1)[rank]),
            "unmasked": err(unmasked, want), "divides": V_pad % t}


def dropout_masks(group):
    """Masks of 64 elements drawn on the default stream and inside fork, and the default
    stream's next draw against a generator that never forked."""
    tracker = seed_tensor_parallel(1234, group)
    same = F.dropout(torch.ones(64), 0.5) > 0
    with tracker.fork():
        differ = F.dropout(torch.ones(64), 0.5) > 0
    after = torch.rand(4)
    masks = [torch.empty(64, dtype=torch.bool) for _ in range(dist.get_world_size(group))]
    dist.all_gather(masks, same, group=group)
    forked = [torch.empty(64, dtype=torch.bool) for _ in range(dist.get_world_size(group))]
    dist.all_gather(forked, differ, group=group)
    torch.manual_seed(1234)
    F.dropout(torch.ones(64), 0.5)  # the same default-stream draws, with no fork between
    return {"same agree": all(torch.equal(m, masks[0]) for m in masks),
            "forked pairs equal": sum(torch.equal(forked[i], forked[j]) for i in range(len(forked))
                                      for j in range(i)),
            "default stream resumed": torch.equal(after, torch.rand(4))}


def coalesced(group):
    """TP+SP GPT gradients with f per parameter vs left partial and summed in one all-reduce."""
    torch.set_default_dtype(torch.float64)
    config = GPTConfig(vocab_size=32, seq_len=8, n_heads=4, hidden=16)
    x, y = synthetic_tokens(2, config, seed=1)
    grads, counts = {}, {}
    for sum_grads in (True, False):
        model = parallelize(GPT(config, seed=0), group, sequence_parallel=True, sum_grads=sum_grads)
        with CommCounter() as backward:
            vocab_parallel_lm_loss(model(x), y, group).backward()
        with CommCounter() as after:
            summed = all_reduce_sequence_partial_grads(model, group) if not sum_grads else 0
        grads[sum_grads] = {n: p.grad.clone() for n, p in model.named_parameters()}
        counts[sum_grads] = (backward.by_op().get("all_reduce", (0,))[0],
                             after.by_op().get("all_reduce", (0,))[0], summed)
    torch.set_default_dtype(torch.float32)
    return {"error": max(err(grads[True][n], grads[False][n]) for n in grads[True]),
            "counts": counts}


def layer_bytes(group):
    """count_layer's ring bytes for one TP layer, forward and backward, in float32."""
    records = count_layer(GPTConfig(vocab_size=32, seq_len=8, n_heads=4, hidden=16), 2, group)
    return sum(r.bus_bytes() for phase in records.values() for r in phase)


def every_case():
    groups = {4: dist.group.WORLD, 2: RankGrid(dp=2, tp=2).new_groups().tp}
    out = {}
    for tp, group in groups.items():
        for n_kv in (1, 2, 4, 8):
            out["gqa", n_kv, tp] = gqa(group, n_kv)
        out["padded", tp] = padded_loss(group)
        out["rng", tp] = dropout_masks(group)
        out["coalesced", tp] = coalesced(group)
        out["layer bytes", tp] = layer_bytes(group)
    out["trapped", 4] = trapped_ratios(dist.group.WORLD)
    out["dtensor partial", 4] = dtensor_partial_reads(dist.group.WORLD)
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(every_case, world_size=4, backend="gloo")


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("n_kv", [1, 2, 4, 8])
def test_gqa_with_replicated_kv_heads_equals_one_process(results, n_kv, tp):
    for rank, r in enumerate(results):
        for what, error in r["gqa", n_kv, tp].items():
            assert error <= TOL, f"rank {rank}, n_kv {n_kv}, tp {tp}: {what} off by {error:.1e}"


def test_kv_heads_of_rank_replicates_when_fewer_than_tp():
    # 8 query heads, 2 KV heads (4 queries each), 4 ranks of 2 query heads: ranks 0, 1 read KV 0
    owners = [list(kv_heads_of_rank(8, 2, 4, r)) for r in range(4)]
    assert owners == [[0], [0], [1], [1]]
    assert [list(kv_heads_of_rank(8, 8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="n_kv_heads 3"):
        kv_heads_of_rank(12, 3, 4, 0)


@pytest.mark.parametrize("tp", [2, 4])
def test_masked_padding_leaves_the_loss_of_the_real_vocabulary(results, tp):
    for r in results:
        p = r["padded", tp]
        assert p["divides"] == 0 and p["loss"] <= TOL and p["grad"] <= TOL
        assert p["unmasked"] > 1e-3  # the padded ids in the softmax do change the loss


def test_padded_vocab_size_is_megatrons_loop():
    def megatron(v, tp, by):  # _vocab_size_with_padding, written as Megatron-LM does
        after = v
        while after % (by * tp):
            after += 1
        return after
    for v, tp, by in [(50257, 1, 128), (50257, 8, 128), (100, 4, 8), (128, 4, 8), (1, 3, 5)]:
        assert padded_vocab_size(v, tp, by) == megatron(v, tp, by)
    with pytest.raises(ValueError, match="tp must be a whole number"):
        padded_vocab_size(100, 0)


@pytest.mark.parametrize("tp", [2, 4])
def test_rng_tracker_masks_agree_outside_and_differ_inside(results, tp):
    for r in results:
        rng = r["rng", tp]
        assert rng["same agree"] and rng["default stream resumed"]
        assert rng["forked pairs equal"] == 0


@pytest.mark.parametrize("tp", [2, 4])
def test_one_coalesced_all_reduce_gives_the_same_gradients(results, tp):
    for r in results:
        c = r["coalesced", tp]
        assert c["error"] <= TOL
        (per_param, after_f, _), (coalesced_bw, after, summed) = c["counts"][True], c["counts"][False]
        # 2 layers x (2 LayerNorms + 2 row biases) x weight/bias-ish: 6 per layer, ln_f 2, positions 1
        assert summed == 2 * 6 + 2 + 1 and after_f == 0 and after == 1
        assert per_param - coalesced_bw == summed


def test_layer_flops_are_torch_flop_counters():
    for cfg, batch in [(GPTConfig(seq_len=16, hidden=32, n_heads=4), 3), (GPTConfig(seq_len=8), 2)]:
        x = torch.randn(batch, cfg.seq_len, cfg.hidden, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            Block(cfg)(x).sum().backward()
        assert counter.get_total_flops() == layer_flops(batch, cfg.seq_len, cfg.hidden)


@pytest.mark.parametrize("tp", [2, 4])
def test_layer_comm_bytes_are_counted_ring_bytes(results, tp):
    assert results[0]["layer bytes", tp] == layer_comm_bytes(2, 8, 16, tp, bytes_per_value=4)


def test_ratio_is_bytes_over_bandwidth_by_flops_over_rate():
    b, s, h, t, B_link, F_rate = 4, 2048, 8192, 8, 450e9, 989e12
    direct = (layer_comm_bytes(b, s, h, t) / B_link) / (layer_flops(b, s, h, t, attention=False) / F_rate)
    assert abs(comm_compute_ratio(h, t, B_link, F_rate) / direct - 1) < 1e-12


# ---- facts lesson 04 states, held here --------------------------------------------------------

def test_table2_floor_is_10_sbh_in_16_bit_and_16_sbh_in_float32_without_masks():
    from dlcourse.memory.accounting import ACTIVATION_FORMULAS
    unsplit = ACTIVATION_FORMULAS["none", False]  # (t, a·s/h, bytes per value, mask bytes) -> ·sbh
    assert unsplit(float("inf"), 2.0, 2, 1) == 10  # the paper's: 4 tensors x 2 bytes + 2 masks x 1
    assert unsplit(float("inf"), 2.0, 4, 0) == 16  # the lesson's dashed curve: 4 tensors x 4 bytes


def trapped_ratios(group):
    """|grad| with g_trap in every row-parallel layer / |grad| with g, per parameter (this rank's
    shards): the trap scales the residual branch it sits in, not what lies below it."""
    from dlcourse.parallel.tensor import RowParallelLinear, g_trap

    class Trap(RowParallelLinear):
        def forward(self, x):
            return g_trap(F.linear(x, self.weight), self.group) + self.bias

    torch.set_default_dtype(torch.float64)
    config = GPTConfig(vocab_size=32, seq_len=8, n_heads=4, hidden=16)
    x, y = synthetic_tokens(2, config, seed=1)
    grads = {}
    for trapped in (False, True):
        model = parallelize(GPT(config, seed=0), group)
        for module in model.modules():
            if trapped and type(module) is RowParallelLinear:
                module.__class__ = Trap
        vocab_parallel_lm_loss(model(x), y, group).backward()
        grads[trapped] = {n: p.grad for n, p in model.named_parameters()}
    torch.set_default_dtype(torch.float32)
    return {n: (grads[True][n].norm() / grads[False][n].norm()).item() for n in grads[False]}


def test_trap_in_a_residual_model_is_not_a_learning_rate(results):
    tp = 4
    for r in results:
        ratios = r["trapped", tp]
        exact = {n for n, q in ratios.items() if abs(q - tp) < 1e-9}
        # last block's MLP branch: ln2, fc, proj weight (proj.bias is added after g: untouched)
        assert exact == {"blocks.1.ln2.weight", "blocks.1.ln2.bias", "blocks.1.mlp.fc.weight",
                         "blocks.1.mlp.fc.bias", "blocks.1.mlp.proj.weight"}
        assert abs(ratios["blocks.1.mlp.proj.bias"] - 1) < 1e-9
        assert abs(ratios["blocks.0.mlp.fc.weight"] - tp) > 0.1  # below the trap: mixed, not 4x


def dtensor_partial_reads(group):
    """DTensor+SP: all-reduces inside optimizer.step, and how many gradients are Partial."""
    from torch.distributed.tensor.parallel import loss_parallel
    from dlcourse.parallel.tensor.compare import build
    config = GPTConfig(vocab_size=32, seq_len=8, n_heads=4, hidden=16)
    x, y = synthetic_tokens(2, config, seed=1)
    model, loss_fn, _ = build("dtensor+sp", GPT(config, seed=0), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with loss_parallel():
        loss_fn(model(x), y).backward()
    partial = sum(any(pl.is_partial() for pl in getattr(p.grad, "placements", ()))
                  for p in model.parameters())
    with CommCounter() as step:
        optimizer.step()
    return partial, step.by_op().get("all_reduce", (0,))[0]


def test_dtensor_sums_each_partial_gradient_at_each_read_by_cpu_adamw(results):
    partial, in_step = results[0]["dtensor partial", 4]
    assert partial == 2 * 4 + 2  # ln1, ln2 (weight, bias) per layer and ln_f
    assert in_step == 3 * partial  # exp_avg.lerp_(grad), exp_avg_sq.addcmul_(grad, grad)
