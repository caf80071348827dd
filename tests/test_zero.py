"""Lesson 05's proofs on real gloo ranks (N = 2, 3, 4): every ZeRO stage, and stages 2, 3 with CPU
offload, equals one process and lesson 03's data parallel after K AdamW steps; clipping by the
global norm of the shards equals torch's clip_grad_norm_ in one process, and SGD on the shards
equals one process's SGD; the bytes each rank holds are ZeRO's formulas; the bytes each rank
sends are 2Ψ and 3Ψ; the peak of a step is the model state held plus one process's working
memory (plus stage 3's gathered units), and stage 2 needs several buckets to lower it.

Ψ = 5,642 for the GPT below: N = 3 and 4 do not divide it (nor its blocks, 2,534 each), so every
shard is padded. One launch per N checks everything (launches cost seconds each).

Tolerances. The proofs run in float64. The ranks add the same numbers as one process in another
order, so gradients differ by rounding (2^-52 ≈ 2e-16 relative); AdamW divides by sqrt(v), which
can turn that into a larger step where a gradient element is near zero (see test_data_parallel).
Measured here: ~1e-14 after 3 steps at lr 1e-2. 1e-10 is far below real mistakes: summing instead
of averaging changes AdamW's update through eps by ~lr * eps / |g| ≈ 1e-8 and more; a wrong shard
or a lost update is O(lr) = 1e-2. Between ranks there is no tolerance: an all-gather hands every
rank the same bits.
Memory: the measured bytes differ from the formula only by the padding (< N values per unit)
and Adam's step counters (one 4-byte scalar per shard tensor), under 1% as the issue asks.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.memory import OffloadAdamW, count_params, model_state_bytes
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.compare import wrap
from dlcourse.parallel.data.steps import shard_batch, train_step
from dlcourse.parallel.zero import FlatShard, ZeroAdamW, shard_bounds, zero
from dlcourse.parallel.zero.measure import (
    comm_formula,
    count_step,
    gathered_bytes,
    held_bytes,
    peak_formula,
    step_peak,
    train_steps,
)

CFG = GPTConfig(vocab_size=31, seq_len=8, n_layers=2, n_heads=2, hidden=14)  # Ψ = 5,642, tied
PSI = count_params(CFG)
PEAK_CFG = GPTConfig(n_layers=4)  # the lesson's GPT: 210,304 parameters
PEAK_CAP_MB = 0.1  # 7 buckets of ~0.13 MB fp32 for DP and stages 1, 2: the peak is not one bucket's
STEPS, LR = 3, 1e-2
EXACT = 1e-10  # float64, see the module docstring
CAP_MB = 0.02  # ~20 KB of float64: stage 2's gradients reduce-scattered in several buckets
MAX_NORM = 0.2  # below this GPT's gradient norm (~0.5 here), so every step clips
CLIP = {"max_grad_norm": MAX_NORM}
# name -> (stage, wrap options, ZeroAdamW options, the one-process reference it must equal)
RUNS = {
    "stage 1": (1, {}, {}, "AdamW"),
    "stage 2": (2, {"bucket_cap_mb": CAP_MB}, {}, "AdamW"),
    "stage 3": (3, {}, {}, "AdamW"),
    "stage 3, no reshard": (3, {"reshard_after_forward": False}, {}, "AdamW"),
    "stage 3 + offload": (3, {}, {"offload": True}, "AdamW"),
    "stage 2 + offload": (2, {"bucket_cap_mb": CAP_MB}, {"offload": True}, "AdamW"),
    "stage 1 + clip": (1, {}, CLIP, "AdamW, clipped"),
    "stage 2 + clip": (2, {"bucket_cap_mb": CAP_MB}, CLIP, "AdamW, clipped"),
    "stage 3 + clip": (3, {}, CLIP, "AdamW, clipped"),
    "stage 2 + SGD": (2, {"bucket_cap_mb": CAP_MB}, {"optimizer_class": torch.optim.SGD}, "SGD"),
}


class Clipped:
    """One process's optimizer step after torch's own `clip_grad_norm_` (the reference)."""

    def __init__(self, optimizer, max_norm):
        self.optimizer, self.max_norm, self.norms = optimizer, max_norm, []
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        self.norms.append(torch.nn.utils.clip_grad_norm_(self.params, self.max_norm).item())
        self.optimizer.step()


REFERENCES = {"AdamW": lambda ps: torch.optim.AdamW(ps, lr=LR),
              "AdamW, clipped": lambda ps: Clipped(torch.optim.AdamW(ps, lr=LR), MAX_NORM),
              "SGD": lambda ps: torch.optim.SGD(ps, lr=LR)}


def snapshot(named):
    return {k: v.detach().clone() for k, v in named.items()}


def proofs(group, data):
    """float64 weights after STEPS AdamW steps: one process, lesson 03's DP, every ZeRO run."""
    x, y = shard_batch(data, group)
    out = {}
    for name, make_optimizer in REFERENCES.items():
        reference = GPT(CFG).double()
        optimizer = make_optimizer(reference.parameters())
        for _ in range(STEPS):
            train_step(reference, optimizer, [data], lm_loss)
        out[name] = snapshot(dict(reference.named_parameters()))
        out[name, "norms"] = getattr(optimizer, "norms", None)
    dp = wrap("overlapped", GPT(CFG).double(), group)
    optimizer = torch.optim.AdamW(dp.parameters(), lr=LR)
    for _ in range(STEPS):
        train_step(dp, optimizer, [(x, y)], lm_loss)
    out["DP (lesson 03)"] = snapshot(dict(dp.module.named_parameters()))
    for name, (stage, options, optim_options, _) in RUNS.items():
        model = zero(stage, GPT(CFG).double(), group, **options)
        optimizer = ZeroAdamW(model, lr=LR, **optim_options)
        norms = []
        for _ in range(STEPS):  # two micro-batches: gradients accumulate into the shards
            train_step(model, optimizer, list(zip(x.split(1), y.split(1))), lm_loss)
            norms.append(optimizer.grad_norm)
        out[name] = snapshot(model.full_parameters())
        out[name, "norms"] = norms
        out[name, "padding"] = padding_values(model)
    return out


def padding_values(model):
    """The largest |value| in this rank's part of the padding (must stay exactly 0)."""
    pads = [shard[max(u.numel - u.start, 0):] for u, shard in zip(model.units, model.shards())]
    return max(p.abs().max().item() if p.numel() else 0.0 for p in pads)


def measurements(group, data, dtype):
    """held bytes, one step's communication and peak per stage (0 = lesson 03's DP)."""
    x, y = shard_batch(data, group)
    out = {}
    for stage in (0, 1, 2, 3):
        model = wrap("overlapped", GPT(CFG).to(dtype), group) if stage == 0 else \
            zero(stage, GPT(CFG).to(dtype), group)
        if stage == 0:
            optimizer = OffloadAdamW(model.parameters(), host="cpu", lr=LR) \
                if dtype == torch.bfloat16 else torch.optim.AdamW(model.parameters(), lr=LR)
        else:
            optimizer = ZeroAdamW(model, lr=LR)
        train_steps(model, optimizer, x, y, 1)
        out[stage, "held"] = held_bytes(model, optimizer)
        out[stage, "comm"] = count_step(model, optimizer, x, y).by_op()
        if stage == 3:
            out["root"] = model.units[model.root]
            out["units"] = model.units
            out["freed"] = sum(p.untyped_storage().nbytes() for p in model.module.parameters())
    return out


def peaks(group):
    """Peak bytes of one fp32 step per stage, on the lesson's GPT (at the tiny CFG the
    collectives' buffers weigh as much as the activations), and one process's working memory."""
    x, y = shard_batch(synthetic_tokens(4 * dist.get_world_size(), PEAK_CFG, seed=1), group)
    single = GPT(PEAK_CFG)
    optimizer = torch.optim.AdamW(single.parameters(), lr=LR)
    train_steps(single, optimizer, x, y, 1)
    peak, before = step_peak(single, optimizer, x, y)
    out = {"working": peak - before}
    for stage in (0, 1, 2, 3):
        cap = {} if stage == 3 else {"bucket_cap_mb": PEAK_CAP_MB}  # stage 3: a unit per Block
        model = wrap("overlapped", GPT(PEAK_CFG), group, **cap) if stage == 0 else \
            zero(stage, GPT(PEAK_CFG), group, **cap)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR) if stage == 0 else \
            ZeroAdamW(model, lr=LR)
        train_steps(model, optimizer, x, y, 1)
        out[stage] = step_peak(model, optimizer, x, y)
        out[stage, "units"] = len(model.units) if stage else len(model.buckets)
    out["gathered"] = gathered_bytes(model)
    out["root bytes"] = model.units[model.root].padded * 4
    # One sequence per rank: few activations, the gradients set the peak. Stage 2 with one bucket
    # (the default cap holds all of this GPT) against PEAK_CAP_MB's 7 buckets.
    x, y = shard_batch(synthetic_tokens(dist.get_world_size(), PEAK_CFG, seed=1), group)
    for cap in (25.0, PEAK_CAP_MB):
        model = zero(2, GPT(PEAK_CFG), group, bucket_cap_mb=cap)
        optimizer = ZeroAdamW(model, lr=LR)
        train_steps(model, optimizer, x, y, 1)
        out["small batch", cap] = step_peak(model, optimizer, x, y)
    return out


def job():
    group = dist.group.WORLD
    data = synthetic_tokens(2 * dist.get_world_size(), CFG, seed=1)
    return {"proofs": proofs(group, data), "peaks": peaks(group),
            "fp32": measurements(group, data, torch.float32),
            "mixed": measurements(group, data, torch.bfloat16)}


@pytest.fixture(scope="module", params=[2, 3, 4])
def ranks(request):
    return request.param, dlcourse.launch(job, world_size=request.param, backend="gloo")


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


def test_every_stage_equals_one_process_and_data_parallel(ranks):
    n, results = ranks
    runs = results[0]["proofs"]
    assert max_diff(runs["DP (lesson 03)"], runs["AdamW"]) <= EXACT, n
    for name, (*_, reference) in RUNS.items():
        assert max_diff(runs[name], runs[reference]) <= EXACT, (n, name)
        for rank, other in enumerate(results[1:], 1):  # the same bits on every rank
            assert max_diff(other["proofs"][name], runs[name]) == 0, (n, name, rank)


def test_clipping_uses_the_global_norm_of_the_averaged_gradient(ranks):
    # Each rank holds a shard; one all-reduce of the squared norms gives the whole gradient's
    # norm, the one torch's clip_grad_norm_ computes in one process (float64: summation order).
    n, results = ranks
    want = results[0]["proofs"]["AdamW, clipped", "norms"]
    assert min(want) > MAX_NORM  # every step really clipped: otherwise clipping proves nothing
    for r in results:
        for name in ("stage 1 + clip", "stage 2 + clip", "stage 3 + clip"):
            got = [g.item() for g in r["proofs"][name, "norms"]]
            assert got == pytest.approx(want, rel=1e-12), (n, name)


def test_padding_never_leaks_into_the_parameters(ranks):
    n, results = ranks
    for r in results:
        for name in RUNS:
            assert r["proofs"][name, "padding"] == 0, (n, name)


@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_bytes_per_rank_are_zeros_formulas(ranks, precision):
    n, results = ranks
    for rank, r in enumerate(results):
        for stage in (0, 1, 2, 3):
            held = r[precision][stage, "held"]
            formula = model_state_bytes(PSI, dp=n, zero_stage=stage,
                                        mixed_precision=precision == "mixed")
            for part in ("params", "grads", "optimizer"):
                want, got = getattr(formula, part), getattr(held, part)
                assert abs(got - want) <= 0.01 * want, (n, rank, stage, part, got, want)
                assert got >= want  # padding and step counters only ever add


def test_stage_3_frees_every_gathered_unit(ranks):
    for r in ranks[1]:
        assert r["fp32"]["freed"] == 0


def test_peak_adds_the_gathered_units_in_stage_3_only(ranks):
    # Peak = model state held before the step + one process's working memory (+ in stage 3 the
    # root and 1 block gathered at the peak: see `gathered_bytes`). Measured: exact for DP and
    # stages 1, 2; stage 3 within 3 KB (0.1%), or, in some runs, one block's bytes more: the
    # profiler also sees the allocations of gloo's own threads, and when an asynchronous
    # collective's working buffer is alive at the main thread's peak it adds to it (timing,
    # not a leak: the same rank's next run may not show it). 1% tells a freed block (45% of Ψ
    # here, 6% of the peak) from a kept one.
    for r in ranks[1]:
        m = r["peaks"]
        assert min(m[stage, "units"] for stage in (0, 1, 2)) >= 4  # several buckets each
        for stage in (0, 1, 2):
            peak, before = m[stage]
            want = peak_formula(stage, before, m["working"])
            assert peak == pytest.approx(want, rel=0.01), (ranks[0], stage, peak, want)
        peak, before = m[3]
        want = peak_formula(3, before, m["working"], m["gathered"])
        block = m["gathered"] - m["root bytes"]  # one block
        # between the formula and one block more (gloo's threads, see above), 1% either side
        assert 0.99 * want <= peak <= 1.01 * (want + block), (ranks[0], peak, want, block)


def test_stage_2_holds_every_gradient_at_its_peak_with_one_bucket_only(ranks):
    # With one bucket, backward ends holding the full gradient (4Ψ bytes, fp32) and flattens it
    # into a padded copy (>= 4Ψ) before the reduce-scatter: the peak is at least 8Ψ above the
    # model state held before. With 7 buckets each leaves as it completes; measured, its peak is
    # lower by more than a whole gradient (1.2 x 4Ψ at N = 4); asserted: by at least the part of
    # the gradient a rank does not keep, 4Ψ (N-1)/N.
    n, results = ranks
    grads = 4 * count_params(PEAK_CFG)
    for r in results:
        peaks = r["peaks"]
        (one, before_one), (several, _) = (peaks["small batch", cap] for cap in (25.0, PEAK_CAP_MB))
        assert one - before_one >= 2 * grads, (n, one, before_one)
        assert one - several >= grads * (n - 1) / n, (n, one, several)


def test_communication_is_2_psi_or_3_psi(ranks):
    n, results = ranks
    for r in results:
        m = r["fp32"]
        for stage in (0, 1, 2):
            bus = sum(b for _, _, b in m[stage, "comm"].values())
            assert bus == pytest.approx(comm_formula(stage, PSI, n), rel=0.01), (n, stage)
        ops = {op: calls for op, (calls, _, _) in m[3, "comm"].items()}
        units = len(m["units"])  # blocks gathered twice, the root (embeddings) once: as FSDP2
        assert ops == {"all_gather": 2 * units - 1, "reduce_scatter": units}, ops
        root = m["root"].padded * 4 * (n - 1) / n
        bus = sum(b for _, _, b in m[3, "comm"].values())
        assert bus == pytest.approx(comm_formula(3, PSI, n) - root, rel=0.01), n


def test_flat_shard_pads_to_a_multiple_of_n_and_views_skip_the_padding():
    params = [torch.randn(3, 2), torch.randn(5)]  # Ψ = 11
    for n in (1, 2, 3, 4, 11, 12):
        units = [FlatShard(["a", "b"], params, n, r) for r in range(n)]
        flat = units[0].flatten(params)
        assert flat.numel() % n == 0 and flat.numel() - 11 < n
        assert torch.equal(flat[11:], torch.zeros(flat.numel() - 11))
        pieces = torch.cat([u.my_shard(flat) for u in units])
        assert torch.equal(pieces, flat)  # the shards tile the buffer, in rank order
        for view, p in zip(units[0].views(flat), params):
            assert torch.equal(view, p)
        assert shard_bounds(11, n, n - 1)[1] == flat.numel()


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="stages 1, 2 and 3"):
        zero(4, GPT(CFG), None)
    with pytest.raises(TypeError, match="wrap the model first"):
        ZeroAdamW(GPT(CFG))
    with pytest.raises(ValueError, match="AdamW only"):
        ZeroAdamW(Sharded(), offload=True, optimizer_class=torch.optim.SGD)


class Sharded:
    """Enough of a ZeRO model for ZeroAdamW's checks: one fp32 shard."""

    def shards(self):
        return [torch.zeros(3, requires_grad=True)]
