"""Lesson 05's check of zero_step (`dlcourse/checks/zero/zero_step.py`): the solutions and correct
answers written other ways pass; the wrong answers students write fail with a message naming the
case, the rank and a hint that says which mistake it was. Every run draws new cases, so each
wrong answer here fails on whatever is drawn."""

import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

from checking import first_line_and_hint, starts
from dlcourse.checks.zero import check_zero_step


# --- exercise 2: zero_step --------------------------------------------------------------------

def _grad_flat(params, dtype):
    return torch.cat([torch.zeros(p.numel(), dtype=dtype) if p.grad is None
                      else p.grad.reshape(-1) for p in params])


def _write_back(params, full):
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def zero_step(params, master, optimizer, group, divide=True, drop=True):
    N, s = dist.get_world_size(group), master.numel()
    flat = F.pad(_grad_flat(params, master.dtype), (0, N * s - sum(p.numel() for p in params)))
    grad_shard = torch.empty_like(master)
    dist.reduce_scatter_single(grad_shard, flat, group=group)
    master.grad = grad_shard / N if divide else grad_shard
    if drop:
        for p in params:
            p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_single(full, master.detach(), group=group)
    _write_back(params, full)


def zero_step_other_way(params, master, optimizer, group):
    """Divides first, reduce-scatters a list into master.grad, gathers a list, zeroes after."""
    N, s = dist.get_world_size(group), master.numel()
    flat = torch.zeros(N * s, dtype=master.dtype)
    psi = sum(p.numel() for p in params)
    flat[:psi] = _grad_flat(params, master.dtype) / N
    for p in params:
        p.grad = None
    master.grad = torch.empty_like(master)
    dist.reduce_scatter(master.grad, list(flat.chunk(N)), group=group)
    optimizer.step()
    optimizer.zero_grad()
    pieces = [torch.empty_like(master) for _ in range(N)]
    dist.all_gather(pieces, master.detach(), group=group)
    torch.nn.utils.vector_to_parameters(torch.cat(pieces)[:psi], params)


def zero_step_summed(params, master, optimizer, group):
    zero_step(params, master, optimizer, group, divide=False)


def zero_step_keeps_full_gradients(params, master, optimizer, group):  # a stage 2 that isn't
    zero_step(params, master, optimizer, group, drop=False)


def zero_step_all_reduce(params, master, optimizer, group):
    N, s, r = dist.get_world_size(group), master.numel(), dist.get_rank(group)
    flat = F.pad(_grad_flat(params, master.dtype), (0, N * s - sum(p.numel() for p in params)))
    dist.all_reduce(flat, group=group)
    master.grad = flat[r * s:(r + 1) * s] / N
    for p in params:
        p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_single(full, master.detach(), group=group)
    _write_back(params, full)


def zero_step_all_reduce_by_process_group(params, master, optimizer, group):  # a bypass
    N, s, r = dist.get_world_size(group), master.numel(), dist.get_rank(group)
    flat = F.pad(_grad_flat(params, master.dtype), (0, N * s - sum(p.numel() for p in params)))
    group.allreduce([flat]).wait()
    master.grad = flat[r * s:(r + 1) * s] / N
    for p in params:
        p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_single(full, master.detach(), group=group)
    _write_back(params, full)


def zero_step_all_reduce_from_all_gather(params, master, optimizer, group):  # by name: allowed
    N, s, r = dist.get_world_size(group), master.numel(), dist.get_rank(group)
    flat = F.pad(_grad_flat(params, master.dtype), (0, N * s - sum(p.numel() for p in params)))
    everyone = torch.empty(N * N * s, dtype=master.dtype)
    dist.all_gather_single(everyone, flat, group=group)  # every rank's whole gradient
    master.grad = everyone.view(N, N * s).sum(dim=0)[r * s:(r + 1) * s] / N  # all-reduce, rebuilt
    for p in params:
        p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_single(full, master.detach(), group=group)
    _write_back(params, full)


def zero_step_padding_per_shard(params, master, optimizer, group):  # right when N divides Ψ
    """Splits the unpadded buffer into N near-equal pieces and pads each: padding lands between
    the pieces, and in the parameters after the gather."""
    N, s = dist.get_world_size(group), master.numel()
    pieces = _grad_flat(params, master.dtype).tensor_split(N)
    flat = torch.cat([F.pad(q, (0, s - q.numel())) for q in pieces])
    grad_shard = torch.empty_like(master)
    dist.reduce_scatter_single(grad_shard, flat, group=group)
    master.grad = grad_shard / N
    for p in params:
        p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_single(full, master.detach(), group=group)
    _write_back(params, full)


def zero_step_with_torch_zero(params, master, optimizer, group):
    ZeroRedundancyOptimizer(params, torch.optim.AdamW, process_group=group)


def zero_step_with_captured_torch_zero(params, master, optimizer, group,
                                       zero=ZeroRedundancyOptimizer):  # captured before
    zero(params, torch.optim.AdamW, process_group=group)


@pytest.mark.parametrize("answer", [zero_step, zero_step_other_way])
def test_zero_step_passes_correct_answers(answer, capsys):
    check_zero_step(answer)
    assert "zero_step: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (zero_step_summed, "rank ? returned wrong values", "reduce-scatter sums"),
    (zero_step_keeps_full_gradients, "rank ? still holds", "p.grad = None"),
    (zero_step_all_reduce, "rank ? called dist.all_reduce, which this exercise does not allow",
     ""),
    # refused where every collective passes (core's guard), else seen there by the check
    (zero_step_all_reduce_by_process_group, ("rank ? called all_reduce (through the process group)",
                                             "rank ? all-reduced in step 1"), "reduce-scatter"),
    (zero_step_padding_per_shard, "rank ? returned wrong values", "padded on its own"),
    (zero_step_all_reduce_from_all_gather, "rank ? reduce-scattered 0 bytes in step 1",
     "reduce-scatter of the whole padded buffer"),
    (zero_step_with_torch_zero, "rank ? called torch's ZeroRedundancyOptimizer", ""),
    (zero_step_with_captured_torch_zero, "rank ? ", ""),
])
def test_zero_step_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_zero_step, answer)
    assert re.match(r"zero_step on \d ranks, ", first), first
    says = says if isinstance(says, tuple) else (says,)
    assert any(starts(first.split(": ", 1)[1], one) for one in says), first
    assert hint in got_hint or hint in first
    if answer is zero_step_with_captured_torch_zero:
        assert "does not allow" in first
