"""Lesson 08 on a device (issue 24's GPU checks): each test takes the device as a parameter, so
its CPU variant runs everywhere and proves the test's logic, and its CUDA variant runs where
torch sees a GPU (CI skips it: `needs_gpu`). The CUDA variants have NOT been run by the author
(no GPU was lent): an instructor with one runs `pytest tests/test_context_parallel_device.py`.

One rank (cp = 1), so one GPU is enough; nothing here needs a message between ranks:
- the from-scratch ring attention (contiguous: one block; zig-zag: two chunks merged with the
  online softmax, the diagonal mask across them) against torch's SDPA on the same device, output
  and the gradients of q, k, v, causal and not;
- the memory one rank's forward holds, against lesson 08's formula (`cp_saved_tensors`): on
  CUDA the caching allocator's own figures (`memory_allocated`, `max_memory_allocated`), on CPU
  the CPU allocator's events under torch's profiler, as lesson 01's `measure_peak` reads them;
- torch's `context_parallel` on one GPU against the from-scratch attention (CUDA only: its
  SDPA sharding rules exist for the CUDA kernels alone, lesson 08 step 8 shows the CPU error).

Tolerances: float64 as lesson 08's proofs (1e-12: measured 3e-15 on CPU). float32: SDPA's kernel
and the written-out blocks add the same products in another order; with unit-variance inputs and
16 keys a row's rounding is ~1e-6, so 1e-5 (CPU float32 measured at most 1e-6).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import dlcourse
from conftest import needs_gpu
from dlcourse.memory.peak import quiet_stderr, running_sum
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.context import Layout, context_parallel, ring_attention
from dlcourse.parallel.context.measure import cp_saved_tensors

B, A, S, D = 2, 4, 16, 8  # batch, heads, sequence, head dim (a multiple of 8: every SDPA kernel)
DEVICES = ["cpu", pytest.param("cuda", marks=[needs_gpu, pytest.mark.gpu])]
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def on_one_rank(fn, device, *args):
    """fn(device, *args) on one rank: gloo for the CPU, nccl with the rank's GPU for CUDA."""
    return dlcourse.launch(fn, device, *args, world_size=1,
                           backend="nccl" if device == "cuda" else "gloo")[0]


def qkv_dout(device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, A, S, D, generator=gen, dtype=torch.float64).to(device, dtype)
            for _ in range(4)]


def leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def max_errors(got, want):
    """(output, q, k, v gradients): max |got - want| of each, as floats."""
    return [(got[0] - want[0]).abs().max().item()] + [
        (g.grad - w.grad).abs().max().item() for g, w in zip(got[1], want[1])]


# ------------------------------------------ (a) the from-scratch ring against SDPA, one device


def ring_against_sdpa(device, layout_name, causal, dtype):
    q, k, v, dout = qkv_dout(device, dtype)
    mine, ref = leaves([q, k, v]), leaves([q, k, v])
    out = ring_attention(*mine, dist.group.WORLD, Layout(layout_name, 1, S), causal)
    want = F.scaled_dot_product_attention(*ref, is_causal=causal)
    out.backward(dout)
    want.backward(dout)
    return str(out.device.type), max_errors((out, mine), (want, ref))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("device", DEVICES)
def test_ring_attention_at_cp_1_equals_sdpa_on_the_same_device(device, layout, causal, dtype):
    ran_on, errors = on_one_rank(ring_against_sdpa, device, layout, causal, dtype)
    assert ran_on == device
    assert max(errors) <= TOL[dtype], (device, layout, causal, errors)


# ------------------------------- (b) one rank's forward memory against lesson 08's formula

# CPU: tiny, for CI; CUDA: a longer sequence. One block's scores are B·a·s² values, one layer's
# saved activations B·s·(17h + a + 4): h large against a·s keeps the temporaries under one layer
MEMORY_CASES = {"cpu": (GPTConfig(vocab_size=64, seq_len=64, n_layers=2, n_heads=2, hidden=64), 2),
                "cuda": (GPTConfig(vocab_size=256, seq_len=2048, n_layers=2, n_heads=2,
                                   hidden=1536), 1)}
# the rest: position ids, the loss, the allocator's rounding (CUDA: 512 bytes a block; the CPU
# profiler reports exact sizes)
SLACK = {"cpu": 4096, "cuda": 2**20}


def transient_bound(config, batch, device):
    """Bytes a forward may hold beyond what it saves, at its busiest (fp32): attention at cp = 1
    makes the scores of the whole sequence, B·a·s² values, and holds at most three such at once
    (scores, scores - lse, its exp; torch's logsumexp makes two of its own with the scores
    alive), with the stacked K/V and the output, 3·B·s·h, and two (s, s) bool masks; the loss
    makes the logits, B·s·V, after attention's temporaries are gone. Measured on CPU: 1.4
    blocks of scores at the last layer, or the logits, whichever is larger."""
    b, s, h, a, V = batch, config.seq_len, config.hidden, config.n_heads, config.vocab_size
    attention = 4 * (3 * b * a * s * s + 3 * b * s * h) + 2 * s * s
    return max(attention, 4 * b * s * V) + SLACK[device]


def forward_memory(device, config, batch):
    """One rank, cp = 1: the bytes its forward (and loss) left held and the most it held,
    beyond what was there before, by the device's allocator; and the formula's saved bytes."""
    model = context_parallel(GPT(config, seed=0), dist.group.WORLD, "ring").to(device)
    x, y = (t.to(device) for t in synthetic_tokens(batch, config, seed=1))
    lm_loss(model(x), y).backward()  # warm-up: cuBLAS's workspace, allocated once, stays
    model.zero_grad(set_to_none=True)
    held, peak = (cuda_forward if device == "cuda" else cpu_forward)(model, x, y)
    saved = sum(r.nbytes for r in cp_saved_tensors(config, batch, 1, "ring"))
    return held, peak, saved, transient_bound(config, batch, device)


def cuda_forward(model, x, y):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = lm_loss(model(x), y)
    torch.cuda.synchronize()
    held, peak = torch.cuda.memory_allocated() - before, torch.cuda.max_memory_allocated() - before
    del loss
    return held, peak


def cpu_forward(model, x, y):
    """The CPU allocator's allocations and frees under torch's profiler, summed in time order
    (lesson 01's `measure_peak`, forward only): what `max_memory_allocated` is on CUDA."""
    from torch.profiler import ProfilerActivity, profile
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = lm_loss(model(x), y)
    events = list(prof.profiler.kineto_results.events())
    end = max(e.start_ns() + e.duration_ns() for e in events)
    peak = running_sum(events, end, 0)
    del loss
    return peak.at_forward_end, peak.bytes


@pytest.mark.parametrize("device", DEVICES)
def test_one_ranks_forward_memory_is_lesson_08s_formula(device):
    config, batch = MEMORY_CASES[device]
    held, peak, saved, transient = on_one_rank(forward_memory, device, config, batch)
    assert transient < saved / config.n_layers  # the bound is tight: one layer more breaks it
    print(f"{device}: held after forward {held:,} B, peak {peak:,} B; formula {saved:,} B "
          f"saved, at most {transient:,} B of temporaries")
    # what the forward leaves held is what autograd saved, the formula's bytes, the loss and
    # the allocator's rounding (512 B a block on CUDA, none on CPU): within 1 %
    assert saved <= held <= 1.01 * saved
    # at its busiest it holds those and one layer's temporaries, never a second layer's
    assert saved <= peak <= saved + transient


# --------------------------------- torch's context_parallel on one GPU, against the scratch


def torch_cp_against_ring(device, causal):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel as torch_cp
    q, k, v, dout = qkv_dout(device, torch.float32)
    mine = leaves([q, k, v])
    out = ring_attention(*mine, dist.group.WORLD, Layout("contiguous", 1, S), causal)
    out.backward(dout)
    mesh = init_device_mesh(device, (1,), mesh_dim_names=("cp",))
    buffers = [t.clone() for t in (q, k, v)]  # sharded in place on entry (cp = 1: unchanged)
    # not restored on exit: by then they are leaves that require grad, which copy_ refuses
    # its sharding rules are for the flash, memory-efficient and cuDNN kernels only: float32
    # takes the memory-efficient one, asked for by name so that no other is picked silently
    with torch_cp(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2],
                  no_restore_buffers=set(buffers)), sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        theirs = [t.requires_grad_() for t in buffers]
        want = F.scaled_dot_product_attention(*theirs, is_causal=causal)
        want.backward(dout)
    return max_errors((out, mine), (want, theirs))


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_torchs_context_parallel_on_one_gpu_equals_the_from_scratch_ring(causal):
    errors = on_one_rank(torch_cp_against_ring, "cuda", causal)
    assert max(errors) <= TOL[torch.float32], errors
