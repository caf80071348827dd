"""The expert MLPs of lesson 09's MoE layer (`dlcourse/moe.py`, `lessons/09_experts.ipynb`):
E MLPs held as stacked weights and run on rows sorted by expert, by a loop or by torch's grouped
GEMM; and DeepSeekMoE's shared experts, which every token goes through. Plain single-process
PyTorch: `dlcourse.parallel.expert` cuts an `Experts` to a rank's block.

    GroupedLinear    n Linear layers as one (n, d_out, d_in) weight, rows grouped by layer:
                     a loop of F.linear, or one `F.grouped_mm` (torch 2.13's rules: its docstring)
    pad_groups       zero rows to a multiple of `align`, for kernels that need it (FP8, MXFP8)
    ContiguousGrad   hands the grouped GEMM's backward a gradient it accepts
    Experts          E MLPs h -> f -> GELU -> h on rows sorted by expert
    SharedExperts    n MLPs every token goes through, held as one MLP of width n·f
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def pad_groups(counts, align):
    """counts (n,) rows per group -> (padded (n,), rows (M,)): each group grown with zero rows
    to a multiple of `align`, at least `align`, and the place of every real row in that padded
    layout. Only for a grouped GEMM that needs aligned groups: the scaled FP8 / MXFP8 kernels
    (torchtitan pads to 16 / 32 rows for them, through torchao); torch 2.13's plain grouped
    GEMM does not (`GroupedLinear`). The zero rows add nothing to any weight's gradient."""
    padded = (counts.clamp(min=1) + align - 1) // align * align  # (n,)
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    first = (counts.cumsum(0) - counts)[group]  # (M,) first row of each row's group, unpadded
    start = (padded.cumsum(0) - padded)[group]  # (M,) the same, padded
    return padded, start + torch.arange(group.numel(), device=counts.device) - first


class ContiguousGrad(torch.autograd.Function):
    """Identity forward; backward hands on the gradient made contiguous. torch 2.13's grouped
    GEMM backward passes the incoming gradient to the op as it is, and the op refuses one with
    zero strides (`y.sum().backward()` sends an expanded one: "Invalid strides/sizes")."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class GroupedLinear(nn.Module):
    """n Linear layers held as one (n, d_out, d_in) weight; rows of x grouped by layer:
    forward(x (M, d_in), counts (n,)) -> (M, d_out), the first counts[0] rows through layer 0...

    With grouped_mm=True one `F.grouped_mm` call replaces the loop. torch 2.13's rules for it,
    read at the source and measured on the CPU (tests/test_expert_parallel_moe.py):
      eager kernel   float32, bfloat16 or float16 (float64 refused); each operand's leading
                     stride a multiple of 16 bytes (widths h, f a multiple of 8 suit all three:
                     `check_grouped_mm`); int32 end offsets; no bias (added here after). The
                     meta function (`torch/_meta_registrations.py`, for tracing) allows bf16 only.
      CPU            a loop of matmuls: groups of any size, empty ones too.
      CUDA           bfloat16 on sm90 / sm100 runs a CUTLASS kernel (`_grouped_mm_cuda` in
                     GroupedBlas.cpp, torch's main branch as stored); every other dtype and GPU
                     a fallback loop of mm. The docstring's "SM >= 80" is what the function
                     supports, not where the kernel runs. The kernel checks group sizes on the
                     device (`prepare_grouped_gemm_data`, GroupMMCommon.cuh): a multiple of 16
                     bytes only where the grouped dim is the contiguous one, no empty group only
                     in a 2-D x 2-D product unless its operands are (column-major, row-major).
                     Autograd's products (logged on the CPU, a test): x (row-major) · W (3-D),
                     grad (row-major) · W (3-D), gradᵀ (column-major) · x (row-major): none
                     is in a checked layout.
                     torchtitan removed its bf16 padding on that ground (commit fe80b63,
                     2 April 2026: "not required by default bf16 grouped mm").
    So the rows go in unpadded. `align` pads each group with zero rows (`pad_groups`) for a
    kernel that needs it (FP8: 16, MXFP8: 32), none of which this course runs."""

    def __init__(self, n, d_in, d_out, bias=True, align=None):
        super().__init__()
        self.align = align  # rows per group a multiple of this, or None: groups as they come
        self.weight = nn.Parameter(torch.empty(n, d_out, d_in))
        self.bias = nn.Parameter(torch.empty(n, d_out)) if bias else None

    def forward(self, x, counts, grouped_mm=False):
        if grouped_mm:
            return self._grouped_mm(x, counts)
        pieces = x.split(counts.tolist())  # one (count_e, d_in) piece per layer, empty ones too
        bias = [None] * len(pieces) if self.bias is None else self.bias
        return torch.cat([F.linear(p, w, b) for p, w, b in zip(pieces, self.weight, bias)])

    def _grouped_mm(self, x, counts):
        gmm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
        if gmm is None:
            raise RuntimeError(f"torch {torch.__version__} has no grouped GEMM; use the loop")
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"grouped_mm takes float32, bfloat16 or float16, got {x.dtype}; "
                             "use the loop (grouped_mm=False) for float64")
        w = self.weight.transpose(-2, -1)  # (n, d_in, d_out), column-major: a view
        if self.align is None:
            offs = counts.cumsum(0).to(torch.int32)  # end row of each group
            y = ContiguousGrad.apply(gmm(x, w, offs=offs))  # (M, d_out)
        else:
            padded, rows = pad_groups(counts, self.align)  # (n,) sizes, (M,) where rows go
            xp = x.new_zeros(int(padded.sum()), x.size(1)).index_copy(0, rows, x)  # (P, d_in)
            y = gmm(xp, w, offs=padded.cumsum(0).to(torch.int32))[rows]  # (M, d_out)
        # torch refuses a bias in grouped_mm ("Bias not supported yet", 2.13): add it here
        return y if self.bias is None else y + self.bias.repeat_interleave(counts, dim=0)

    def narrow(self, start, n):
        """A GroupedLinear of layers start..start+n-1: copies of this one's weights, on their
        device and in their dtype."""
        part = GroupedLinear(n, self.weight.size(2), self.weight.size(1), self.bias is not None,
                             self.align)
        part.to(self.weight.device, self.weight.dtype)
        with torch.no_grad():
            part.weight.copy_(self.weight[start:start + n])
            if self.bias is not None:
                part.bias.copy_(self.bias[start:start + n])
        return part


class Experts(nn.Module):
    """E expert MLPs h -> f -> GELU -> h, the dense `MLPBlock`'s shape each:
    forward(x (M, h) sorted by expert, counts (E,)) -> (M, h) in the same order."""

    def __init__(self, n_experts, hidden, expert_hidden, bias=True, grouped_mm=False):
        super().__init__()
        self.n_experts, self.grouped_mm = n_experts, grouped_mm
        self.fc = GroupedLinear(n_experts, hidden, expert_hidden, bias)
        self.proj = GroupedLinear(n_experts, expert_hidden, hidden, bias)

    def forward(self, x, counts):
        return self.proj(F.gelu(self.fc(x, counts, self.grouped_mm)), counts, self.grouped_mm)


class SharedExperts(nn.Module):
    """DeepSeekMoE's shared experts (Dai et al. 2024, §3.2): n expert MLPs h -> f -> h that every
    token goes through with weight 1, beside its routed experts. The sum of n MLPs on the same
    input is one MLP of width n·f (stack the first layers, put the second side by side, add the
    biases), so they are held as that, as DeepSeek-V3's released code does (inference/model.py:
    MLP(dim, n_shared_experts * moe_inter_dim)). (N, h) -> (N, h)."""

    def __init__(self, n, hidden, expert_hidden, bias=True):
        super().__init__()
        self.fc = nn.Linear(hidden, n * expert_hidden, bias=bias)
        self.proj = nn.Linear(n * expert_hidden, hidden, bias=bias)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))
