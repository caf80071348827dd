"""Lesson 09 on a device (issue 25's GPU checks): each test takes the device as a parameter, so
its CPU variant runs everywhere and proves the test's logic, and its CUDA variant runs where
torch sees a GPU (CI skips it: `needs_gpu`). The CUDA variants have NOT been run by the author
(no GPU was lent): an instructor with one runs `pytest tests/test_expert_parallel_device.py`.

- One expert-parallel MoE layer's all-to-alls, counted by `CommCounter` on the device, against
  the lesson's formula k·b·s·h·(ep-1)/ep under uniform routing (`count_layer`): on CPU 2 gloo
  ranks; on CUDA nccl, one rank a GPU, ep = min(GPUs, 2). With one GPU ep = 1: the sizes of the
  tensors exchanged are still checked, but the formula's bytes over a link are 0 (no other
  rank); bytes across GPUs need two of them.
- The experts as one grouped GEMM (`F.grouped_mm`, torch 2.13; `torch._grouped_mm` before)
  against the loop over experts, forward and backward, on the device: float32 and bfloat16 on
  CPU (torch 2.13's CPU kernel, a loop of matmuls, takes float32, bfloat16 and float16 and
  refuses float64), bfloat16 on CUDA (its docstring: bfloat16 on GPUs of compute capability 8.0
  or more). The groups go in unpadded, an empty one and sizes not a multiple of 8 among them:
  on sm90/sm100 this is the check that the CUTLASS kernel's device asserts let them through
  (`moe.GroupedLinear`'s docstring says why they should).
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from conftest import needs_gpu
from dlcourse.models import MoEConfig
from dlcourse.moe_experts import Experts
from dlcourse.parallel.expert.measure import all_to_all_formula, count_layer, rows_moved

CFG = MoEConfig(vocab_size=32, seq_len=8, n_layers=1, n_heads=4, hidden=16, n_experts=4, top_k=2)
BATCH = 2  # sequences per rank
CUDA = [needs_gpu, pytest.mark.gpu]


def ep_and_backend(device):
    if device == "cuda":
        return min(torch.cuda.device_count(), 2), "nccl"  # nccl: one GPU per rank
    return 2, "gloo"


# ------------------------------------------- the all-to-all bytes on the device, vs formula


def layer_bytes(device):
    group = dist.group.WORLD
    records, moe = count_layer(CFG, BATCH, group, uniform=True, device=device)
    table = {phase: [(r.op, r.nbytes, r.bus_bytes()) for r in rs] for phase, rs in records.items()}
    return table, rows_moved(moe, group), moe.experts.fc.weight.device.type


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_moe_layer_bytes_on_the_device_are_the_formula(device):
    ep, backend = ep_and_backend(device)
    results = dlcourse.launch(layer_bytes, device, world_size=ep, backend=backend)
    E, k, h, itemsize = CFG.n_experts, CFG.top_k, CFG.hidden, 4
    rows = k * BATCH * CFG.seq_len  # k·b·s rows each way under uniform routing
    data = rows * h * itemsize
    for table, moved, ran_on in results:
        assert ran_on == device
        assert moved == {"dispatch": rows, "combine": rows, "own": rows // ep}
        # forward: the (k, E) int64 counts all-gathered, the E counts exchanged, dispatch and
        # combine; backward: the reverse of the last two
        assert [r[:2] for r in table["forward"]] == [
            ("all_gather", ep * k * E * 8), ("all_to_all", E * 8),
            ("all_to_all", data), ("all_to_all", data)]
        assert [r[:2] for r in table["backward"]] == [("all_to_all", data)] * 2
        for phase in ("forward", "backward"):
            for op, nbytes, bus in table[phase][-2:]:
                assert bus == all_to_all_formula(CFG, BATCH, ep)
                assert bus == (rows - moved["own"]) * h * itemsize  # the rows that leave


# ----------------------------------------- grouped GEMM against the loop, on the device


def grouped_mm_runs_on(device):
    """Whether this torch has a grouped GEMM kernel for `device`: one of its own, or torch's
    composite kernel (every device; the only one in 2.13's CPU build)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has("aten::_grouped_mm", device.upper()) or has("aten::_grouped_mm",
                                                           "CompositeExplicitAutograd")


# float32: two matmul orders over 16- and 64-long dot products, ~1e-6 (as the CPU test in
# test_expert_parallel_moe.py). bfloat16 (8 significant bits, 2^-8 = 3.9e-3): both ways round
# the same inputs, add in float32 in their own order and round each layer's output once; GELU
# and the second layer carry the first rounding on: a few units of 2^-8 of the largest value
# (CPU measured at most 6.5e-3 of it in bfloat16, 1.4e-7 in float32)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
GROUPED_CASES = [("cpu", torch.float32), ("cpu", torch.bfloat16),
                 pytest.param("cuda", torch.bfloat16, marks=CUDA)]


def loop_and_grouped(device, dtype):
    """[output, x.grad, each parameter's grad] of the experts as a loop and as grouped GEMM."""
    gen = torch.Generator().manual_seed(0)
    experts = Experts(4, 16, 64)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    experts.to(device, dtype)
    # groups as routing makes them, handed to torch's kernel unpadded: sizes not a multiple
    # of 8 and an expert with no rows (on CUDA bf16 sm90/sm100 the CUTLASS kernel's device
    # checks must let these through in the layouts `GroupedLinear` uses: its docstring)
    counts = torch.tensor([5, 0, 19, 8], device=device)
    x = torch.randn(32, 16, generator=gen).to(device, dtype).requires_grad_()
    grad = torch.randn(32, 16, generator=gen).to(device, dtype)
    results = []
    for grouped in (False, True):
        experts.grouped_mm = grouped
        experts.zero_grad()
        x.grad = None
        y = experts(x, counts)
        y.backward(grad)
        grads = [p.grad.clone() for p in experts.parameters()]
        results.append([y.detach(), x.grad.clone()] + grads)
    return results


@pytest.mark.parametrize("device, dtype", GROUPED_CASES,
                         ids=["cpu-float32", "cpu-bfloat16", "cuda-bfloat16"])
def test_grouped_gemm_equals_the_expert_loop_on_the_device(device, dtype):
    if not grouped_mm_runs_on(device):
        pytest.skip(f"torch {torch.__version__} has no grouped GEMM kernel for {device}")
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("torch's CUDA grouped GEMM takes GPUs of compute capability 8.0 or more")
    loop, grouped = loop_and_grouped(device, dtype)
    names = ["output", "x.grad"] + [f"{n}.grad" for n, _ in Experts(4, 16, 64).named_parameters()]
    for name, want, got in zip(names, loop, grouped):
        assert got.device.type == device and got.dtype == dtype, name
        error = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item()
        assert error <= TOL[dtype] * max(scale, 1.0), f"{name}: {error:.2e} (largest {scale:.2e})"
