"""Lesson 04's checks (`dlcourse/checks/tensor_parallel.py`, `tensor_layers.py`,
`tensor_library.py`) on real gloo ranks: the solutions and correct answers written other ways
pass; the wrong answers students write fail with a message naming the case (and its seed), the
rank, expected vs got, and a hint naming the mistake; the library's answers are refused however
they are reached. Every run draws new cases (tp 2, 3 and 4, sizes, values), so each wrong answer
here fails on whatever is drawn."""

import re
import types
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F

import dlcourse.checks.tensor_parallel.refused as tensor_library
import dlcourse.parallel.tensor.comm as tp_comm
from checking import first_line_and_hint, starts
from dlcourse.checks.core.refuse import ForbiddenCall
from dlcourse.checks.tensor_parallel import (check_column_parallel_linear, check_f, check_g,
                                             check_qkv_shard, check_row_parallel_linear,
                                             check_vocab_parallel_cross_entropy)


def _tp(group):
    return dist.get_world_size(group), dist.get_rank(group)


def expect_failure(check, answer, exercise, says, hint=""):
    """The check fails on `answer`: first line '<exercise> on N ranks, ... seed S...: <says>'."""
    first, got_hint = first_line_and_hint(check, answer)
    assert re.match(rf"{exercise} on \d ranks, .*seed \d+", first), first
    says = says if isinstance(says, tuple) else (says,)
    parts = first.split(": ")[1:]  # after the case, and after "backward: x.grad" if there
    assert any(starts(part, one) for part in parts for one in says), first
    assert hint in got_hint or hint in first, (first, got_hint)
    return first, got_hint


# --- exercise 1: column-parallel linear -------------------------------------------------------

def column_parallel_linear(x, weight, bias, group):
    y = F.linear(x, weight, bias)  # (..., out/t)
    pieces = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, y, group=group)
    return torch.cat(pieces, dim=-1)


def column_into_one_buffer(x, weight, bias, group):  # one buffer of rows, rank axis moved
    y = x @ weight.T + (0 if bias is None else bias)
    rows = y.reshape(-1, y.size(-1))  # (M, out/t)
    t = dist.get_world_size(group)
    out = rows.new_empty((t * rows.size(0), rows.size(1)))  # the ranks' rows, stacked
    dist.all_gather_single(out, rows, group=group)
    return out.view(t, *y.shape).movedim(0, -2).reshape(*y.shape[:-1], -1)


def _gathered(x, weight, bias, group, n=None):
    y = F.linear(x, weight, bias)
    pieces = [torch.empty_like(y) for _ in range(n or dist.get_world_size(group))]
    dist.all_gather(pieces, y, group=group)
    return pieces


def column_cat_dim0(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group), dim=0)


def column_no_gather(x, weight, bias, group):
    return F.linear(x, weight, bias)


def column_reversed(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group)[::-1], dim=-1)


def column_no_bias(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, None, group), dim=-1)


def column_tp4_only(x, weight, bias, group):
    return torch.cat(_gathered(x, weight, bias, group, n=4), dim=-1)


def column_from_the_library(x, weight, bias, group):
    from dlcourse.parallel.tensor import gather_last_dim
    return gather_last_dim(F.linear(x, weight, bias), group)


@pytest.mark.parametrize("answer", [column_parallel_linear, column_into_one_buffer])
def test_column_parallel_linear_passes_correct_answers(answer, capsys):
    check_column_parallel_linear(answer)
    assert "column_parallel_linear: passed on 3 cases drawn with seed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (column_cat_dim0, "rank ? returned shape", "along the last dim"),
    (column_no_gather, "rank ? returned shape", "all-gather the blocks"),
    (column_reversed, "rank ? returned wrong values", "wrong order"),
    (column_no_bias, "rank ? returned wrong values", "bias is missing"),
    (column_tp4_only, "rank ? raised", ""),
    (column_from_the_library, "rank ? called gather_last_dim from dlcourse.parallel.tensor", ""),
])
def test_column_parallel_linear_fails_wrong_answers(answer, says, hint):
    expect_failure(check_column_parallel_linear, answer, "column_parallel_linear", says, hint)


# --- exercise 2: row-parallel linear ----------------------------------------------------------

def row_parallel_linear(x, weight, bias, group):
    t, r = _tp(group)
    partial = x.chunk(t, dim=-1)[r] @ weight.T  # (..., out): this rank's term of the sum
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


def row_bias_on_rank0(x, weight, bias, group):  # the bias goes into the sum, from one rank
    _, r = _tp(group)
    n = weight.size(1)
    y = F.linear(x[..., r * n:(r + 1) * n], weight, bias if r == 0 else None)
    dist.all_reduce(y, group=group)
    return y


def row_bias_on_every_rank(x, weight, bias, group):
    t, r = _tp(group)
    y = F.linear(x.chunk(t, dim=-1)[r], weight, bias)
    dist.all_reduce(y, group=group)
    return y


def row_split_wrong_dim(x, weight, bias, group):
    t, r = _tp(group)
    partial = x.chunk(t, dim=0)[r] @ weight.T
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


def row_no_all_reduce(x, weight, bias, group):
    t, r = _tp(group)
    return F.linear(x.chunk(t, dim=-1)[r], weight, bias)


def row_tp4_only(x, weight, bias, group):
    _, r = _tp(group)
    partial = x.chunk(4, dim=-1)[r] @ weight.T
    dist.all_reduce(partial, group=group)
    return partial if bias is None else partial + bias


@pytest.mark.parametrize("answer", [row_parallel_linear, row_bias_on_rank0])
def test_row_parallel_linear_passes_correct_answers(answer, capsys):
    check_row_parallel_linear(answer)
    assert "row_parallel_linear: passed on 3 cases drawn with seed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (row_bias_on_every_rank, "rank ? returned wrong values", "the bias was added"),
    (row_split_wrong_dim, ("rank ? raised", "rank ? returned"), ""),
    (row_no_all_reduce, "rank ? returned wrong values", "partial sum"),
    (row_tp4_only, ("rank ? raised", "rank ? returned"), ""),
])
def test_row_parallel_linear_fails_wrong_answers(answer, says, hint):
    expect_failure(check_row_parallel_linear, answer, "row_parallel_linear", says, hint)


# --- exercises 3 and 4: f and g ---------------------------------------------------------------

class MegatronF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class FReturnsItsInput(torch.autograd.Function):  # Megatron's: the input itself, async reduce
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        summed = grad.clone()
        dist.all_reduce(summed, group=ctx.group, async_op=True).wait()
        return summed, None


class FNoBackwardReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class FReducesForward(torch.autograd.Function):  # f and g swapped
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class FAverages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad / dist.get_world_size(ctx.group), None


class FCallsTheLibrarysBackward(torch.autograd.Function):  # a bypass: the method by hand
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        from dlcourse.parallel.tensor.comm import CopyToTensorParallel
        return CopyToTensorParallel.backward(ctx, grad)


class FSubclassesTheLibrary(tp_comm.CopyToTensorParallel):  # a bypass: inherits apply
    pass


def not_a_function(x, group):
    return x


@pytest.mark.parametrize("answer", [MegatronF, FReturnsItsInput])
def test_f_passes_correct_answers(answer, capsys):
    check_f(answer)
    assert "f: passed on 3 cases drawn with seed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (FNoBackwardReduce, "rank ? returned wrong values", "must all-reduce it"),
    (FReducesForward, "rank ? returned wrong values", "the all-reduce belongs in backward"),
    (FAverages, "rank ? returned wrong values", "averaged"),
    (FCallsTheLibrarysBackward, "rank ? called CopyToTensorParallel.backward from", ""),
    (FSubclassesTheLibrary, "rank ? used CopyToTensorParallel from", ""),
])
def test_f_fails_wrong_answers(answer, says, hint):
    expect_failure(check_f, answer, "f", says, hint)


def test_f_wants_the_class():
    first, _ = first_line_and_hint(check_f, not_a_function)
    assert "autograd Function class" in first


class MegatronG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GInPlace(torch.autograd.Function):  # Megatron's: the caller's tensor overwritten
    @staticmethod
    def forward(ctx, x, group):
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad.clone(), None


class GReducesBackwardToo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class GNoReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GAverages(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x / dist.get_world_size(group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@pytest.mark.parametrize("answer", [MegatronG])
def test_g_passes_correct_answers(answer, capsys):
    check_g(answer)
    assert "g: passed on 3 cases drawn with seed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (GReducesBackwardToo, "rank ? returned wrong values", "times too large"),
    (GNoReduce, "rank ? returned wrong values", "partial output"),
    (GAverages, "rank ? returned wrong values", "averaged"),
    (MegatronF, "rank ? returned wrong values", ""),  # f handed in for g
    (GInPlace, "rank ? changed the tensor it was given", "all-reduce a copy"),
])
def test_g_fails_wrong_answers(answer, says, hint):
    first, _ = expect_failure(check_g, answer, "g", says, hint)
    if answer is GReducesBackwardToo:
        assert "backward: W_r.grad" in first


# --- exercise 5: the fused qkv ----------------------------------------------------------------

def qkv_shard(qkv, group):
    t, r = _tp(group)
    w = torch.cat([part.chunk(t, dim=0)[r] for part in qkv.weight.chunk(3, dim=0)])
    b = None if qkv.bias is None else torch.cat([p.chunk(t)[r] for p in qkv.bias.chunk(3)])
    return w, b


def qkv_by_view(qkv, group):  # (3h, h) seen as (q/k/v, rank, h/t, h)
    t, r = _tp(group)
    h = qkv.in_features
    w = qkv.weight.view(3, t, h // t, h)[:, r].reshape(-1, h)
    b = None if qkv.bias is None else qkv.bias.view(3, t, -1)[:, r].reshape(-1)
    return w, b


def qkv_contiguous_chunks(qkv, group):
    t, r = _tp(group)
    return qkv.weight.chunk(t)[r], None if qkv.bias is None else qkv.bias.chunk(t)[r]


def qkv_wrong_dim(qkv, group):
    t, r = _tp(group)
    w = torch.cat([part.chunk(t, dim=1)[r] for part in qkv.weight.chunk(3, dim=0)])
    return w, None if qkv.bias is None else qkv.bias


def qkv_bias_contiguous(qkv, group):
    t, r = _tp(group)
    w, _ = qkv_shard(qkv, group)
    return w, None if qkv.bias is None else qkv.bias.chunk(t)[r]


def qkv_tp4_only(qkv, group):
    _, r = _tp(group)
    h = qkv.in_features
    w = qkv.weight.view(3, 4, -1, h)[:, r].reshape(-1, h)
    b = None if qkv.bias is None else qkv.bias.view(3, 4, -1)[:, r].reshape(-1)
    return w, b


def qkv_from_the_library(qkv, group):
    from dlcourse.parallel.tensor.layers import shard
    t, r = _tp(group)
    return shard(qkv.weight, 0, r, t, parts=3), None


def qkv_patching_the_checks_helper(qkv, group):
    """Wrong rows (contiguous blocks), and the check's helper rebound in the rank to give the
    right term of the attention whatever the rows: issue 28's escape."""
    import dlcourse.checks.tensor_parallel.layers as layers

    def heads(attn, w, b, x, rank, tp):  # this rank's share of the whole attention
        y = attn(x).detach()
        return (y if attn.proj.bias is None else y - attn.proj.bias.detach()) / tp

    layers._heads = heads
    return qkv_contiguous_chunks(qkv, group)


@pytest.mark.parametrize("answer", [qkv_shard, qkv_by_view])
def test_qkv_shard_passes_correct_answers(answer, capsys):
    check_qkv_shard(answer)
    assert "qkv_shard: passed on 3 cases drawn with seed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (qkv_contiguous_chunks, "rank ? returned wrong values", "contiguous blocks of rows"),
    (qkv_patching_the_checks_helper, "rank ? returned wrong values", "contiguous blocks of rows"),
    (qkv_wrong_dim, "rank ? returned a weight of", "cuts the weight's columns"),
    (qkv_bias_contiguous, "rank ? returned wrong values", "bias was cut"),
    (qkv_tp4_only, ("rank ? raised", "rank ? returned"), ""),
    (qkv_from_the_library, "rank ? called shard from dlcourse.parallel.tensor.layers", ""),
])
def test_qkv_shard_fails_wrong_answers(answer, says, hint):
    expect_failure(check_qkv_shard, answer, "qkv_shard", says, hint)


# --- exercise 6: vocabulary-parallel cross-entropy --------------------------------------------

def _target_logit(z, targets, group):
    """(N,) z[target] on the rank holding the target, 0 elsewhere."""
    t, r = _tp(group)
    n = z.size(-1)
    mine = (targets >= r * n) & (targets < (r + 1) * n)
    local = (targets - r * n).clamp(0, n - 1)
    return z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * mine


def _global_max(logits, group):
    m = logits.detach().max(dim=-1).values  # (N,)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    return m


def vocab_parallel_cross_entropy(logits, targets, group):  # composed with g
    z = logits - _global_max(logits, group).unsqueeze(-1)
    sum_exp = MegatronG.apply(z.exp().sum(dim=-1), group)
    z_target = MegatronG.apply(_target_logit(z, targets, group), group)
    return (sum_exp.log() - z_target).mean()


class VocabCrossEntropy(torch.autograd.Function):  # Megatron's way: backward by hand
    @staticmethod
    def forward(ctx, logits, targets, group):
        z = logits - _global_max(logits, group).unsqueeze(-1)
        sum_exp, z_target = z.exp().sum(dim=-1), _target_logit(z, targets, group)
        both = torch.stack([sum_exp, z_target])  # (2, N): one all-reduce
        dist.all_reduce(both, group=group)
        t, r = _tp(group)
        n = logits.size(-1)
        onehot = F.one_hot(targets, t * n)[:, r * n:(r + 1) * n].to(logits.dtype)
        ctx.save_for_backward(z.exp() / both[0].unsqueeze(-1) - onehot)
        return (both[0].log() - both[1]).mean()

    @staticmethod
    def backward(ctx, grad):
        (softmax_minus_onehot,) = ctx.saved_tensors
        return softmax_minus_onehot * grad / softmax_minus_onehot.size(0), None, None


def loss_by_hand(logits, targets, group):
    return VocabCrossEntropy.apply(logits, targets, group)


def loss_gathers_the_logits(logits, targets, group):
    whole = torch.cat(dist_nn.all_gather(logits, group=group), dim=-1)  # (N, V)
    return F.cross_entropy(whole, targets)


def loss_gathers_then_keeps_own(logits, targets, group):  # the values and own gradient right
    t, r = _tp(group)
    pieces = [torch.empty_like(logits) for _ in range(t)]
    dist.all_gather(pieces, logits.detach().contiguous(), group=group)
    pieces[r] = logits
    return F.cross_entropy(torch.cat(pieces, dim=-1), targets)


def loss_gathers_row_by_row(logits, targets, group):  # each gather smaller than the logits
    t, r = _tp(group)
    losses = []
    for row, target in zip(logits, targets):
        pieces = [torch.empty_like(row) for _ in range(t)]
        dist.all_gather(pieces, row.detach().contiguous(), group=group)
        pieces[r] = row
        losses.append(F.cross_entropy(torch.cat(pieces)[None], target[None]))
    return torch.stack(losses).mean()


def loss_with_torch_all_reduce(logits, targets, group):  # the g trap
    z = logits - _global_max(logits, group).unsqueeze(-1)
    sum_exp = dist_nn.all_reduce(z.exp().sum(dim=-1), group=group)
    z_target = dist_nn.all_reduce(_target_logit(z, targets, group), group=group)
    return (sum_exp.log() - z_target).mean()


def loss_without_max(logits, targets, group):
    sum_exp = MegatronG.apply(logits.exp().sum(dim=-1), group)
    return (sum_exp.log() - MegatronG.apply(_target_logit(logits, targets, group), group)).mean()


def loss_local_max(logits, targets, group):
    z = logits - logits.detach().max(dim=-1, keepdim=True).values
    sum_exp = MegatronG.apply(z.exp().sum(dim=-1), group)
    return (sum_exp.log() - MegatronG.apply(_target_logit(z, targets, group), group)).mean()


def loss_not_differentiable(logits, targets, group):
    with torch.no_grad():
        return vocab_parallel_cross_entropy(logits, targets, group)


def loss_from_the_library(logits, targets, group):
    from dlcourse.parallel.tensor import vocab_parallel_cross_entropy as library_loss
    return library_loss(logits, targets, group)


def loss_from_dtensor(logits, targets, group):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    mesh = DeviceMesh("cpu", list(range(dist.get_world_size(group))))
    with loss_parallel():
        return F.cross_entropy(DTensor.from_local(logits, mesh, [Shard(1)]), targets)


@pytest.mark.parametrize("answer", [vocab_parallel_cross_entropy, loss_by_hand])
def test_vocab_parallel_cross_entropy_passes_correct_answers(answer, capsys):
    check_vocab_parallel_cross_entropy(answer)
    assert "vocab_parallel_cross_entropy: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (loss_gathers_the_logits, "rank ? moved", "a few numbers per token"),
    (loss_gathers_then_keeps_own, "rank ? moved", "a few numbers per token"),
    (loss_gathers_row_by_row, "rank ? moved", "a few numbers per token"),
    (loss_with_torch_all_reduce, "rank ? returned wrong values", "times too large"),
    (loss_without_max, ("rank ? returned wrong values", "rank ? raised"), ""),
    (loss_local_max, "rank ? returned wrong values", ""),
    (loss_not_differentiable, "rank ? the loss does not require grad", ""),
    (loss_from_the_library, "rank ? called vocab_parallel_cross_entropy from", ""),
    (loss_from_dtensor, "rank ? called torch's loss_parallel", ""),
])
def test_vocab_parallel_cross_entropy_fails_wrong_answers(answer, says, hint):
    expect_failure(check_vocab_parallel_cross_entropy, answer, "vocab_parallel_cross_entropy",
                   says, hint)


# --- cases drawn afresh; the library refused however it is reached -----------------------------

def test_cases_are_drawn_afresh_and_a_seed_replays_them(capsys):
    check_row_parallel_linear(row_parallel_linear)
    check_row_parallel_linear(row_parallel_linear)
    seeds = re.findall(r"seed (\d+)", capsys.readouterr().out)
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    first, _ = first_line_and_hint(check_row_parallel_linear, row_bias_on_every_rank,
                                   seed=int(seeds[0]))
    again, _ = first_line_and_hint(check_row_parallel_linear, row_bias_on_every_rank,
                                   seed=int(seeds[0]))
    assert first == again and f"seed {seeds[0]}" in first


def column_recording(path, x, weight, bias, group):
    y = column_parallel_linear(x, weight, bias, group)
    torch.save(y, f"{path}/{dist.get_world_size(group)}_{dist.get_rank(group)}.pt")
    return y


def column_from_a_table(path, x, weight, bias, group):  # one run's outputs, replayed
    return torch.load(f"{path}/{dist.get_world_size(group)}_{dist.get_rank(group)}.pt")


def test_a_table_of_one_runs_outputs_passes_that_run_only(tmp_path, capsys):
    check_column_parallel_linear(partial(column_recording, str(tmp_path)))
    seed = int(re.search(r"seed (\d+)", capsys.readouterr().out)[1])
    table = partial(column_from_a_table, str(tmp_path))
    check_column_parallel_linear(table, seed=seed)  # the same cases again: the table holds
    first, _ = first_line_and_hint(check_column_parallel_linear, table)  # fresh cases
    assert re.search(r"rank \d returned (shape|wrong values)", first), first


def column_through_a_captured_alias(x, weight, bias, group, gather=tp_comm.gather_last_dim):
    return gather(F.linear(x, weight, bias), group)  # the default was bound before the check


def test_a_library_function_captured_before_the_check_is_refused():
    first, _ = first_line_and_hint(check_column_parallel_linear, column_through_a_captured_alias)
    assert "gather_last_dim from dlcourse.parallel.tensor.comm" in first, first
    assert "which this exercise does not allow" in first


LIBRARY_STUB = '''
import torch

class Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None

def column_answer(x, weight, bias, group):
    return x
'''


def test_every_public_function_and_class_of_the_package_is_refused(tmp_path, monkeypatch):
    """A stand-in package: whatever its modules define is found by walking it, and refused
    through an alias made before, a copy of the function, a subclass, and a method called by
    hand. (Here in this process: a rank imports the real package; the tests above show the
    real package's answers refused in the ranks the same ways.)"""
    package = tmp_path / "fake_tensor"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "split.py").write_text(LIBRARY_STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tensor_library.TENSOR, "packages", ("fake_tensor",))
    from fake_tensor.sub import split
    names = {name for name, _ in tensor_library.TENSOR.objects()}
    assert {"Split from fake_tensor.sub.split", "column_answer from fake_tensor.sub.split"} <= names
    captured = split.column_answer  # an alias made before the refusal
    copy = types.FunctionType(captured.__code__, captured.__globals__)  # a copy, made before

    def via_copy(x, weight, bias, group):
        return copy(x, weight, bias, group)

    class ViaSubclass(split.Split):
        pass

    x = torch.ones(2)
    refused_ways = (lambda: captured(x, None, None, None), lambda: split.Split.apply(x, None),
                    lambda: split.Split.forward(None, x, None), lambda: ViaSubclass.apply(x, None))
    with tensor_library.TENSOR.refusing() as refused:
        for way in refused_ways:
            with pytest.raises(ForbiddenCall, match="fake_tensor.sub.split, which this exercise"):
                way()
        assert "column_answer from fake_tensor.sub.split" in refused.copies_in(via_copy)
    assert split.column_answer(x, None, None, None) is x  # all put back afterwards
    assert torch.equal(split.Split.apply(x, None), x) and torch.equal(ViaSubclass.apply(x, None), x)
