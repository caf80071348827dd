"""Lesson 04's sequence-parallel checks (`dlcourse/checks/tensor/sequence_parallel.py`,
`sync_layernorm_grads.py`): the solution and
answers written another way pass on real ranks; a pair that gathers along the wrong dim, one that
all-reduces (or all-gathers the whole) and keeps a slice, a LayerNorm whose gradients are not
summed or are averaged fail with a message that names the mistake; the lesson's own pair and
its LayerNorm are refused."""

import re

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse.checks.tensor import check_layernorm_grads, check_sequence_parallel


def _gather(x, group, dim=1):
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def _reduce_scatter(x, group, dim=1):
    chunks = [c.contiguous() for c in x.chunk(dist.get_world_size(group), dim=dim)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, group=group)
    return out


class GatherSequence(torch.autograd.Function):  # the solution notebook's, as a student writes it
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group), None


class ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.group), None


class GatherSingle(torch.autograd.Function):  # another way: the _single collectives, T first
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t = dist.get_world_size(group)
        shard = x.transpose(0, 1).contiguous()  # (T/t, B, h)
        out = shard.new_empty((t * shard.size(0), *shard.shape[1:]))
        dist.all_gather_single(out, shard, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size(ctx.group)
        full = grad.transpose(0, 1).contiguous()
        out = full.new_empty((full.size(0) // t, *full.shape[1:]))
        dist.reduce_scatter_single(out, full, group=ctx.group)
        return out.transpose(0, 1), None


class GatherWrongDim(GatherSequence):  # gathers along the hidden dim
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, group, dim=-1)


class ScatterByAllReduce(ReduceScatterSequence):  # all-reduce, then keep this rank's tokens
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].clone()


class ScatterByAllGather(ReduceScatterSequence):  # every rank's whole partial, summed, sliced
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        total = torch.stack(parts).sum(0)
        return total.chunk(dist.get_world_size(group), dim=1)[dist.get_rank(group)].clone()


class GatherBackwardSlices(GatherSequence):  # backward keeps its slice without summing
    @staticmethod
    def backward(ctx, grad):
        t, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(t, dim=1)[rank].contiguous(), None


class LibraryGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        from dlcourse.parallel.tensor.comm import gather_sequence
        return gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def sync_layernorm_grads(layernorm, group):
    for p in layernorm.parameters():
        dist.all_reduce(p.grad, group=group)


def sync_flat(layernorm, group):  # another way: one all-reduce of both, copied back
    grads = [p.grad for p in layernorm.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def sync_nothing(layernorm, group):
    pass


def sync_average(layernorm, group):
    for p in layernorm.parameters():
        dist.all_reduce(p.grad, group=group)
        p.grad /= dist.get_world_size(group)


def sync_weight_only(layernorm, group):
    dist.all_reduce(layernorm.weight.grad, group=group)


def sync_by_all_gather(layernorm, group):  # right values, t times the bytes
    for p in layernorm.parameters():
        parts = [torch.empty_like(p.grad) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, p.grad, group=group)
        p.grad.copy_(torch.stack(parts).sum(0))


# --- the pair ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gather", [GatherSequence, GatherSingle])
def test_the_pair_passes(gather, capsys):
    check_sequence_parallel(gather, ReduceScatterSequence)
    assert "GatherSequence, ReduceScatterSequence: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("gather, scatter, says, hint", [
    (GatherWrongDim, ReduceScatterSequence, "rank ? raised ValueError: GatherSequence.apply on",
     ""),
    (GatherSequence, ScatterByAllReduce, "forward: rank ? moved all_gather",
     "t times what a reduce-scatter does"),
    (GatherSequence, ScatterByAllGather, "forward: rank ? moved all_gather",
     "t times what a reduce-scatter does"),
    (GatherBackwardSlices, ReduceScatterSequence, "backward: x.grad", ""),
])
def test_wrong_pairs_fail(gather, scatter, says, hint):
    first, got_hint = first_line_and_hint(check_sequence_parallel, gather, scatter)
    assert re.search(re.escape(says).replace(re.escape("rank ?"), r"rank \d"), first), first
    assert hint in got_hint, got_hint


def test_a_byte_failure_names_the_collectives_and_the_whole_tensor():
    first, _ = first_line_and_hint(check_sequence_parallel, GatherSequence, ScatterByAllReduce)
    assert "all_reduce" in first and "one reduce-scatter of it" in first


def test_the_lessons_pair_is_refused():
    first, _ = first_line_and_hint(check_sequence_parallel, LibraryGather, ReduceScatterSequence)
    assert "gather_sequence from dlcourse.parallel.tensor.comm" in first, first
    assert "not allow" in first, first


class ConjugateGather(torch.autograd.Function):  # the student's collectives, the lesson's Function
    @staticmethod
    def forward(ctx, x, group):
        from dlcourse.parallel.tensor.comm import Conjugate
        ctx.group = group
        return Conjugate.apply(x, group, _gather, _reduce_scatter)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.group), None


def test_the_lessons_conjugate_function_is_refused_too():
    # gather_sequence is Conjugate handed the two collectives: Conjugate is a lesson answer too
    first, _ = first_line_and_hint(check_sequence_parallel, ConjugateGather, ReduceScatterSequence)
    assert "Conjugate" in first and "not allow" in first, first


def test_the_lessons_layernorm_is_refused_in_sync():
    def sync_by_library(layernorm, group):
        from dlcourse.parallel.tensor.layers import SequenceParallelLayerNorm
        SequenceParallelLayerNorm(layernorm, group)

    first, _ = first_line_and_hint(check_layernorm_grads, sync_by_library)
    assert "SequenceParallelLayerNorm" in first and "not allow" in first, first


def test_a_function_instead_of_a_class_is_named_before_any_rank_starts():
    first, _ = first_line_and_hint(check_sequence_parallel, lambda x, g: x,
                                   ReduceScatterSequence)
    assert first.startswith("GatherSequence: the check needs your autograd Function class")


def test_a_stub_left_in_the_second_class_is_named():
    class ReduceScatterStub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group):
            raise NotImplementedError("Hint: it is GatherSequence read backwards")

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("Hint: it is GatherSequence read backwards")

    first, _ = first_line_and_hint(check_sequence_parallel, GatherSequence, ReduceScatterStub)
    assert first.startswith("ReduceScatterSequence is not written yet"), first


# --- the LayerNorm's gradients -------------------------------------------------------------------


@pytest.mark.parametrize("answer", [sync_layernorm_grads, sync_flat])
def test_sync_layernorm_grads_passes(answer, capsys):
    check_layernorm_grads(answer)
    assert "sync_layernorm_grads: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (sync_nothing, "LayerNorm weight.grad: rank 0 returned wrong values",
     "Megatron-LM issue #1446"),
    (sync_average, "LayerNorm weight.grad: rank 0 returned wrong values", "averaged"),
    (sync_weight_only, "LayerNorm bias.grad: rank 0 returned wrong values", "issue #1446"),
    (sync_by_all_gather, "rank 0 moved all_gather", "all-reduce (sum)"),
])
def test_wrong_syncs_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_layernorm_grads, answer)
    assert says in first, first
    assert hint in got_hint, got_hint
