"""The planner's per-tensor activation count (`dlcourse/planner/activations.py`) against
Korthikanti et al. 2022, Table 2 (GPT-3's layer), and against what autograd really saves in a
tiny GPT block (dlcourse.models) and a tiny Llama block written here, both measured with
lesson 01's `SavedTensorLog`. Nothing is allowed to differ: the counts are exact in bytes."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.memory import SavedTensorLog, activation_bytes
from dlcourse.memory.calculator import REAL_MODELS, ModelSpec, spec_params
from dlcourse.models import Block, GPTConfig
from dlcourse.planner.activations import layer_activation_bytes, layer_saved_tensors
from dlcourse.planner.catalog import LLAMA31_8B, megatron_gpt
from dlcourse.planner.estimate import memory_per_gpu
from dlcourse.planner.layouts import Layout, Workload

B, T = 2, 16
DTYPES = {torch.float32: 4, torch.bfloat16: 2}


@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt3_layer_is_korthikanti_table_2(tp, sp, recompute):
    """Without the rows the paper leaves out as small (norm statistics), GPT-3's layer is
    Table 2's row for every tp, sequence parallelism and recomputation."""
    gpt3 = megatron_gpt("GPT-3 175B", 96, 12288, 96)
    rows = layer_saved_tensors(gpt3, 2048, 1, tp=tp, sequence_parallel=sp, recompute=recompute,
                               attention="eager")
    paper = sum(nbytes for _, nbytes, in_paper in rows if in_paper)
    assert paper == activation_bytes(2048, 1, 12288, 96, tp=tp, sequence_parallel=sp,
                                     recompute=recompute)


def measured(block, x, ignore=()):
    """Bytes autograd saves in `block(x)`, each storage once (lesson 01's SavedTensorLog), less
    the causal mask: an (s, s) bool that masked_fill saves, built from a buffer, the same for
    every batch and width, which no GPU kernel keeps (is_causal); the count leaves it out."""
    with SavedTensorLog(block, ignore=ignore) as log:
        out = block(x)
    mask = sum(r.nbytes for r in log.records
               if r.new and r.dtype == torch.bool and r.shape == (T, T))
    held = log.live_bytes()["activations"] - mask
    out.float().sum().backward()  # the saved tensors are usable: backward runs
    return held


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpt_block_saves_what_the_count_says(dtype, dropout):
    config = GPTConfig(seq_len=T, n_heads=4, hidden=32, dropout=dropout)
    block = Block(config).to(dtype).train()
    spec = ModelSpec("tiny GPT", 1, 32, 4, 128, T, ffn=128, kv_heads=4, gated_mlp=False,
                     bias=True, tied=True, learned_positions=True, dropout=dropout > 0)
    x = torch.randn(B, T, 32, dtype=dtype, requires_grad=True)
    got = measured(block, x)
    e = DTYPES[dtype]  # torch's CPU dropout keeps its mask, and CPU layer_norm its mean and
    # 1/std, in the values' dtype (CUDA: bool masks, fp32 statistics, the count's defaults)
    assert got == layer_activation_bytes(spec, T, B, attention="eager", bytes_per_value=e,
                                         mask_bytes=e, stat_bytes=e)


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm as fused kernels do it (Apex, Transformer Engine): save the input and 1/rms."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        acc = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for gradcheck
        rstd = torch.rsqrt(x.to(acc).pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x.to(acc) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat, g = x.to(rstd.dtype) * rstd, (grad * weight).to(rstd.dtype)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * xhat).flatten(0, -2).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return FusedRMSNorm.apply(x, self.weight, 1e-6)


class FusedSwiGLU(torch.autograd.Function):
    """SwiGLU as Megatron-LM's fused kernel does it (megatron/core/fusions/fused_bias_swiglu.py,
    SwiGLUFunction): save only the input, gate and up side by side, and redo SiLU in backward."""

    @staticmethod
    def forward(ctx, y):  # y: (..., 2 ffn), gate then up
        ctx.save_for_backward(y)
        gate, up = y.chunk(2, -1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors[0].chunk(2, -1)
        sig = torch.sigmoid(gate)
        return torch.cat([grad * up * sig * (1 + gate * (1 - sig)), grad * gate * sig], -1)


def test_fused_swiglu_is_swiglu():
    y = torch.randn(B, T, 2 * 8, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(FusedSwiGLU.apply, (y,))
    gate, up = y.chunk(2, -1)
    assert torch.allclose(FusedSwiGLU.apply(y), F.silu(gate) * up)


class LlamaBlock(nn.Module):
    """Llama's layer: RMSNorm, grouped-query attention with rotary embeddings, RMSNorm, SwiGLU;
    no bias, no dropout. attention: "fused" (SDPA, K/V at kv_heads) or "eager" (repeat_kv);
    mlp: "eager" (autograd's SwiGLU) or "fused" (one gate-and-up matmul into `FusedSwiGLU`)."""

    def __init__(self, h, heads, kv_heads, ffn, attention, mlp="eager"):
        super().__init__()
        self.a, self.kv, self.d, self.attention = heads, kv_heads, h // heads, attention
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, kv_heads * self.d, bias=False)
        self.v = nn.Linear(h, kv_heads * self.d, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.mlp = mlp
        if mlp == "fused":  # Megatron's linear_fc1: gate and up in one (h, 2 ffn) matmul
            self.gate_up = nn.Linear(h, 2 * ffn, bias=False)
        else:
            self.gate, self.up = (nn.Linear(h, ffn, bias=False) for _ in range(2))
        self.down = nn.Linear(ffn, h, bias=False)
        angles = torch.outer(torch.arange(T).float(), 1e4 ** (-torch.arange(0, self.d, 2) / self.d))
        self.register_buffer("cos", angles.cos().repeat(1, 2))  # (T, d)
        self.register_buffer("sin", angles.sin().repeat(1, 2))

    def rotate(self, t):  # t: (B, heads, T, d)
        half = t.shape[-1] // 2
        rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * self.cos.to(t.dtype) + rotated * self.sin.to(t.dtype)

    def attend(self, x):
        Bx, Tx, h = x.shape
        q = self.rotate(self.q(x).view(Bx, Tx, self.a, self.d).transpose(1, 2))
        k = self.rotate(self.k(x).view(Bx, Tx, self.kv, self.d).transpose(1, 2))
        v = self.v(x).view(Bx, Tx, self.kv, self.d).transpose(1, 2)
        if self.attention == "fused":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = (t.repeat_interleave(self.a // self.kv, dim=1) for t in (k, v))
            scores = (q @ k.transpose(-2, -1)) / self.d ** 0.5
            causal = torch.ones(Tx, Tx, dtype=torch.bool).tril()
            y = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(Bx, Tx, h))

    def forward(self, x):
        x = x + self.attend(self.norm1(x))
        y = self.norm2(x)
        if self.mlp == "fused":
            return x + self.down(FusedSwiGLU.apply(self.gate_up(y)))
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def test_fused_rmsnorm_is_rmsnorm():
    x = torch.randn(B, T, 32, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x, w: FusedRMSNorm.apply(x, w, 1e-6), (x, w))
    assert torch.allclose(FusedRMSNorm.apply(x, w, 1e-6), F.rms_norm(x, [32], w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attention, mlp", [("fused", "eager"), ("eager", "eager"),
                                            ("fused", "fused")])
def test_llama_block_saves_what_the_count_says(dtype, attention, mlp):
    h, heads, kv_heads, ffn = 32, 4, 2, 48
    block = LlamaBlock(h, heads, kv_heads, ffn, attention, mlp).to(dtype)
    spec = ModelSpec("tiny Llama", 1, h, heads, 128, T, ffn=ffn, kv_heads=kv_heads,
                     gated_mlp=True, bias=False, tied=False, learned_positions=False)
    x = torch.randn(B, T, h, dtype=dtype, requires_grad=True)
    # rotary's cos/sin tables, saved by the multiplications, are (s, d) buffers with no batch
    # and no width: not activations (`ignore` takes storages that exist now, so the tables
    # are made the block's dtype first and `rotate`'s cast is then the table itself)
    block.cos, block.sin = block.cos.to(dtype), block.sin.to(dtype)
    got = measured(block, x, ignore=(block.cos, block.sin))
    assert got == layer_activation_bytes(spec, T, B, attention=attention, mlp=mlp,
                                         bytes_per_value=DTYPES[dtype])


LLAMA7 = REAL_MODELS["Llama-2 7B"]

def test_light_ends_take_a_layer_off_the_first_and_last_chunk_as_llama_3_did():
    """Dubey et al. 2024 §3.3.2: one layer fewer on the first and last stage; with one layer a
    chunk, 'the first model chunk on the first stage has only the embedding'."""
    from dlcourse.planner.estimate import chunk_layers

    assert chunk_layers(126, 16, light_ends=True) == [7] + [8] * 14 + [7]
    assert chunk_layers(126, 16 * 8, light_ends=True) == [0] + [1] * 126 + [0]
    assert chunk_layers(126, 16) == [8] * 16
    for layers, chunks in [(32, 4), (32, 3), (80, 16), (126, 32)]:
        split = chunk_layers(layers, chunks, light_ends=True)
        assert sum(split) == layers and max(split) - min(split) <= 2, (layers, chunks, split)


def test_light_ends_memory_is_the_busiest_rank_by_lesson_06s_schedule():
    """With light ends rank 0 holds p micro-batches of a lighter stage and rank 1 p - 1 of a
    whole one: the planner's memory is the larger, each rank with its own model state."""
    from dlcourse.parallel.pipeline.measure import in_flight_peak
    from dlcourse.parallel.pipeline.schedules import one_f_one_b
    from dlcourse.planner.estimate import _state_bytes, rank_params
    from dlcourse.planner.timing import layer_activations

    work = Workload(LLAMA7, 4096, 32 * 8 * 4096)
    layout = Layout(8, 1, 4, zero_stage=1, micro_batches=32, light_ends=True)
    one = layer_activations(work, layout)
    log_probs = 4 * 4096 * LLAMA7.vocab_size
    stage = {0: 7 * one, 1: 9 * one, 2: 9 * one, 3: 7 * one + log_probs}  # 34 slots: 8 9 9 8
    per_rank = [_state_bytes(rank_params(LLAMA7, layout, r), layout)
                + in_flight_peak(one_f_one_b(r, 4, 32), {r: stage[r]}) for r in range(4)]
    assert memory_per_gpu(work, layout) == pytest.approx(max(per_rank), rel=1e-12)


def test_llama_31_8b_spec_counts_torchtitans_model():
    """The catalog's Llama 3.1 8B against torchtitan's own arithmetic (9dec370): the FFN width
    from its rule, and the parameters of 32 of this file's Llama blocks at that shape (built
    on the meta device: no memory), the embedding, the untied head and the final norm."""
    spec = LLAMA31_8B
    hidden = int(1.3 * int(2 * 4 * spec.hidden / 3))  # FeedForward: 2/3 of 4h, times 1.3
    assert spec.ffn == 1024 * -(-hidden // 1024)  # rounded up to a multiple of 1,024
    with torch.device("meta"):
        block = LlamaBlock(spec.hidden, spec.n_heads, spec.kv_heads, spec.ffn, "fused")
    per_block = sum(p.numel() for p in block.parameters())
    total = spec.n_layers * per_block + 2 * spec.vocab_size * spec.hidden + spec.hidden
    assert spec_params(spec) == total
