"""Lesson 05's checks (`dlcourse/checks/zero.py` and its `zero_*.py` modules) on real gloo ranks:
the solutions and correct answers written other ways pass, the wrong answers students write fail
with a message naming the case, the rank, expected vs got and a hint that says which mistake it
was (then the seed that repeats the cases), and the library's answers are refused however they
are reached. Every run draws new cases, so each wrong answer here fails on whatever is drawn."""

import math
import re
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

import dlcourse.checks.zero.shards as zero_checks
from checking import first_line_and_hint, starts
from dlcourse.checks.zero import (check_gather_and_free, check_shard_of, check_zero_bytes_per_rank,
                                  check_zero_step)
from dlcourse.memory import model_state_bytes


def _flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


# --- exercise 1: shard_of ---------------------------------------------------------------------

def shard_of(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    padded = torch.zeros(N * s, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return padded[r * s:(r + 1) * s].clone()


def shard_padded_then_chunked(params, group):  # F.pad and chunk
    N = dist.get_world_size(group)
    flat = _flat(params)
    return F.pad(flat, (0, (-flat.numel()) % N)).chunk(N)[dist.get_rank(group)].clone()


def shard_by_offsets(params, group):  # the slice, then zeros after it
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = math.ceil(flat.numel() / N)
    mine = flat[r * s:(r + 1) * s]
    return torch.cat([mine, torch.zeros(s - mine.numel(), dtype=flat.dtype)])


def shard_chunk_unpadded(params, group):
    return _flat(params).chunk(dist.get_world_size(group))[dist.get_rank(group)].clone()


def shard_tensor_split(params, group):  # unequal shards
    return _flat(params).tensor_split(dist.get_world_size(group))[dist.get_rank(group)].clone()


def shard_floor(params, group):  # right only when N divides Ψ
    flat = _flat(params)
    s = flat.numel() // dist.get_world_size(group)
    r = dist.get_rank(group)
    return flat[r * s:(r + 1) * s].clone()


def shard_view(params, group):  # right only when N divides Ψ
    return _flat(params).view(dist.get_world_size(group), -1)[dist.get_rank(group)].clone()


def shard_by_parameter(params, group):  # ZeroRedundancyOptimizer's way
    mine = params[dist.get_rank(group)::dist.get_world_size(group)]
    return _flat(mine) if mine else _flat(params)[:0]


def shard_padded_with_ones(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    return F.pad(flat, (0, N * s - flat.numel()), value=1.0)[r * s:(r + 1) * s].clone()


def shard_padded_in_front(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    return F.pad(flat, (N * s - flat.numel(), 0))[r * s:(r + 1) * s].clone()


@pytest.mark.parametrize("answer", [shard_of, shard_padded_then_chunked, shard_by_offsets])
def test_shard_of_passes_correct_answers(answer, capsys):
    check_shard_of(answer)
    assert "shard_of: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (shard_chunk_unpadded, "rank ?", ""),  # fewer chunks than ranks, or short ones
    (shard_tensor_split, "rank ? returned shape", "pad with zeros"),
    (shard_floor, "rank ? returned shape", "rounds down"),
    (shard_view, "rank ? raised RuntimeError", ""),
    (shard_by_parameter, "rank ?", ""),
    (shard_padded_with_ones, "rank ? returned wrong values", "must be zeros"),
    (shard_padded_in_front, "rank ? returned wrong values", ""),
])
def test_shard_of_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_shard_of, answer)
    assert re.match(r"shard_of on \d ranks, .*: rank \d", first), first
    assert starts(first.split(": ", 1)[1], says), first
    assert hint in got_hint


def test_shard_by_parameter_is_named_when_it_returns_whole_parameters():
    # a case with several parameters, where rank 0's whole ones are not its shard: a few seeds
    for seed in range(20):
        try:
            check_shard_of(shard_by_parameter, seed=seed)
        except AssertionError as error:
            if "whole parameters" in str(error):
                return
    pytest.fail("no drawn case named the whole-parameter mistake")


def _message(check, answer, **kwargs):
    with pytest.raises(AssertionError) as failed:
        check(answer, **kwargs)
    return str(failed.value)


def test_cases_are_drawn_afresh_and_a_seed_replays_them():
    seeds = [re.search(r"cases drawn from seed (\d+)", _message(check_shard_of, shard_floor))
             for _ in range(2)]
    assert all(seeds) and seeds[0].group(1) != seeds[1].group(1)
    seed = int(seeds[0].group(1))
    again = [_message(check_shard_of, shard_floor, seed=seed).splitlines()[0] for _ in range(2)]
    assert again[0] == again[1]


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


# --- exercise 3: gather_and_free --------------------------------------------------------------

def _storage(full):
    return full.untyped_storage()


def _hooks(unit, gather, free, forward_free=True, backward_gather=True, backward_free=True):
    def call(action):
        def hook(*_):
            action()  # a hook that returns something replaces the output: return None
        return hook

    unit.register_forward_pre_hook(call(gather))
    if forward_free:
        unit.register_forward_hook(call(free))
    if backward_gather:
        unit.register_full_backward_pre_hook(call(gather))
    if backward_free:
        unit.register_full_backward_hook(call(free))


def _free(full):
    def free():
        _storage(full).resize_(0)
    return free


def _gatherer(full, shard, group, communicate=True):
    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        if communicate:
            dist.all_gather_single(full, shard, group=group)
    return gather


def gather_and_free(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full))


def gather_and_free_tensor_hooks(unit, full, shard, group):
    """Gathers a list into full's chunks, and uses hooks on the unit's output and input."""
    def gather(*_):
        _storage(full).resize_(full.numel() * full.element_size())
        dist.all_gather(list(full.chunk(dist.get_world_size(group))), shard, group=group)

    def free(*_):
        _storage(full).resize_(0)

    def before(module, args):
        gather()
        args[0].register_hook(free)  # its gradient is the unit's last: backward is done

    def after(module, args, output):
        free()
        output.register_hook(gather)  # the unit's backward starts from this gradient

    unit.register_forward_pre_hook(before)
    unit.register_forward_hook(after)


def gather_and_free_never_frees(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), lambda: None)


def gather_and_free_keeps_through_forward(unit, full, shard, group):  # frees after backward only
    _hooks(unit, _gatherer(full, shard, group), _free(full),
           forward_free=False, backward_gather=False)


def gather_and_free_keeps_after_backward(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full), backward_free=False)


def gather_and_free_no_gather_before_backward(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full),
           backward_gather=False)


def gather_and_free_allocates_without_gathering(unit, full, shard, group):
    allocate = _gatherer(full, shard, group, communicate=False)
    _hooks(unit, _gatherer(full, shard, group), _free(full), backward_gather=False)
    unit.register_full_backward_pre_hook(lambda *_: allocate())


def gather_and_free_reversed_ranks(unit, full, shard, group):
    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        dist.all_gather(list(reversed(full.chunk(dist.get_world_size(group)))), shard,
                        group=group)
    _hooks(unit, gather, _free(full))


def gather_and_free_from_a_hidden_copy(unit, full, shard, group):
    """Gathers once, when installed, keeps a full copy, and makes a 1-element all-reduce before
    each pass to look as if it gathered: issue 28's escape."""
    _gatherer(full, shard, group)()
    hidden, token = full.clone(), torch.zeros(1, dtype=full.dtype)
    _free(full)()

    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        full.data.copy_(hidden)  # as a collective writes: no autograd version bump
        dist.all_reduce(token, group=group)

    _hooks(unit, gather, _free(full))


def gather_and_free_with_fsdp(unit, full, shard, group):
    fully_shard(unit)


@pytest.mark.parametrize("answer", [gather_and_free, gather_and_free_tensor_hooks])
def test_gather_and_free_passes_correct_answers(answer, capsys):
    check_gather_and_free(answer)
    assert "gather_and_free: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (gather_and_free_never_frees, "rank ? still holds", "forward hook"),
    (gather_and_free_keeps_through_forward, "rank ? still holds", "forward hook"),
    (gather_and_free_keeps_after_backward, "rank ? still holds", "once the unit's backward"),
    (gather_and_free_no_gather_before_backward, "rank ? raised RuntimeError",
     "storage of size 0"),
    (gather_and_free_allocates_without_gathering, "rank ? made no collective in backward",
     "gather again"),
    (gather_and_free_reversed_ranks, "rank ? returned wrong values", "rank order"),
    (gather_and_free_from_a_hidden_copy, "rank ? made all_reduce of 8 bytes in forward 1: a "
                                         "correct answer gathers", "gather before the unit's forward"),
    (gather_and_free_with_fsdp, "rank ? called torch's fully_shard", ""),
])
def test_gather_and_free_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_gather_and_free, answer)
    assert re.match(r"gather_and_free on \d ranks, ", first), first
    assert starts(first.split(": ", 1)[1], says), first
    assert hint in got_hint


# --- exercise 4: zero_bytes_per_rank ----------------------------------------------------------

PER = {True: (2, 2, 12), False: (4, 4, 8)}


def _bytes(n_params, world_size, stage, mixed, shard):
    parts = dict(zip(("params", "grads", "optimizer"), PER[mixed]))
    partitioned = ("optimizer", "grads", "params")[:stage]
    return {p: b * (shard(n_params, world_size) if p in partitioned else n_params)
            for p, b in parts.items()}


def zero_bytes_per_rank(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: -(-n // N))


def bytes_with_math_ceil(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: math.ceil(n / N))


def bytes_exact_division(n_params, world_size, stage, mixed_precision):  # N must divide Ψ
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: n / N)


def bytes_floor(n_params, world_size, stage, mixed_precision):
    return _bytes(n_params, world_size, stage, mixed_precision, lambda n, N: n // N)


def bytes_stage_off_by_one(n_params, world_size, stage, mixed_precision):
    return zero_bytes_per_rank(n_params, world_size, min(stage + 1, 3), mixed_precision)


def bytes_padding_everywhere(n_params, world_size, stage, mixed_precision):
    padded = world_size * -(-n_params // world_size)
    got = zero_bytes_per_rank(padded, world_size, stage, mixed_precision)
    return got


def bytes_from_the_library(n_params, world_size, stage, mixed_precision):
    return model_state_bytes(n_params, dp=world_size, zero_stage=stage,
                             mixed_precision=mixed_precision).as_dict()


def bytes_from_a_captured_library(n_params, world_size, stage, mixed_precision,
                                  formula=model_state_bytes):  # bound before the check
    return formula(n_params, dp=world_size, zero_stage=stage).as_dict()


@pytest.mark.parametrize("answer", [zero_bytes_per_rank, bytes_with_math_ceil])
def test_zero_bytes_per_rank_passes_correct_answers(answer):
    check_zero_bytes_per_rank(answer)


@pytest.mark.parametrize("answer, hint", [
    (bytes_exact_division, "right only when N divides Ψ"),
    (bytes_floor, "rounds down"),
    (bytes_stage_off_by_one, "partition the"),
    (bytes_padding_everywhere, ""),
    (bytes_from_the_library, ""),
    (bytes_from_a_captured_library, ""),
])
def test_zero_bytes_per_rank_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_zero_bytes_per_rank, answer)
    assert re.match(r"zero_bytes_per_rank\(n_params=[\d,]+, .*\): ", first), first
    assert hint in got_hint
    if answer in (bytes_from_the_library, bytes_from_a_captured_library):
        assert "which this exercise does not allow" in first


# --- the library's answers, however they are reached ------------------------------------------

LIBRARY_STUB = '''
class ZeroStage3:
    def __init__(self, model):
        self.model = model

def shard_flat(flat, world_size, rank):
    return flat.chunk(world_size)[rank]

def zero_bytes(n_params, world_size, stage, mixed_precision):
    return {"params": 0, "grads": 0, "optimizer": 0}
'''


def test_every_public_function_and_class_of_the_package_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "fake_zero"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "stages.py").write_text(LIBRARY_STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(zero_checks.BYTES_ANSWERS, "packages", ("fake_zero",))
    from fake_zero.sub import stages
    names = {name for name, _ in zero_checks.BYTES_ANSWERS.objects()}
    assert {f"{n} from fake_zero.sub.stages" for n in ("ZeroStage3", "shard_flat",
                                                         "zero_bytes")} <= names
    captured = stages.zero_bytes  # an alias made before the check runs

    def via_alias(n_params, world_size, stage, mixed_precision):
        return captured(n_params, world_size, stage, mixed_precision)

    def via_class(n_params, world_size, stage, mixed_precision):
        sys.modules["fake_zero.sub.stages"].ZeroStage3(None)

    for answer in (via_alias, via_class):
        first, _ = first_line_and_hint(check_zero_bytes_per_rank, answer)
        assert "which this exercise does not allow" in first, first
    assert stages.zero_bytes(1, 1, 0, True)["params"] == 0  # all put back afterwards
    assert stages.ZeroStage3("m").model == "m"


# the lesson's own code, dlcourse.parallel.zero, reached by its names and through aliases

def shard_from_the_library(params, group):
    from dlcourse.parallel.zero.shards import FlatShard
    layout = FlatShard([str(i) for i in range(len(params))], params,
                       dist.get_world_size(group), dist.get_rank(group))
    return layout.my_shard(layout.flatten([p.detach() for p in params])).clone()


def shard_from_the_library_bounds(params, group):
    import dlcourse.parallel.zero as zero
    flat = _flat(params)
    start, end = zero.shard_bounds(flat.numel(), dist.get_world_size(group), dist.get_rank(group))
    return F.pad(flat, (0, end - start))[start:end].clone()


def bytes_from_the_lesson(n_params, world_size, stage, mixed_precision):
    from dlcourse.parallel.zero import shard_numel
    return _bytes(n_params, world_size, stage, mixed_precision, shard_numel)


@pytest.mark.parametrize("check, answer", [
    (check_shard_of, shard_from_the_library),
    (check_shard_of, shard_from_the_library_bounds),
    (check_zero_bytes_per_rank, bytes_from_the_lesson),
])
def test_the_lessons_zero_code_is_refused(check, answer):
    first, _ = first_line_and_hint(check, answer)
    assert "dlcourse.parallel.zero" in first and "which this exercise does not allow" in first, \
        first
