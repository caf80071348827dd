"""The communication of tensor parallelism as tiny autograd Functions (lesson 04,
`lessons/04_tensor_parallel.ipynb`). Layers compose them; no layer calls a collective itself.

Megatron-LM (Shoeybi et al. 2019, Section 3) names two conjugate operators:

    f   forward: identity          backward: all-reduce     enters a tensor-parallel region
    g   forward: all-reduce        backward: identity       leaves one (sums the partial outputs)

Sequence parallelism (Korthikanti et al. 2022, Section 4.2.2) replaces them with a conjugate pair
that also moves the sequence dimension (dim 1 of the course GPT's (B, T, h) activations):

    gather_sequence          forward: all-gather along T    backward: reduce-scatter along T
    reduce_scatter_sequence  forward: reduce-scatter to T   backward: all-gather along T

Both are one `Conjugate` Function, handed the collective and its conjugate in opposite orders
(lesson 08's Ulysses all-to-alls are one too).

`gather_last_dim` is the seed's picture: each rank computed some output columns; all-gather them
(backward: keep this rank's columns of the gradient).

`sum_over_holders` sums the gradient of weight rows that several ranks hold alike (grouped-query
attention's KV heads when there are fewer than ranks, `gqa.py`).

`g_trap` is `g` built on torch's differentiable `torch.distributed.nn.functional.all_reduce`,
whose backward all-reduces too: every gradient behind it comes out tp_size times too large.
"""

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: each rank uses the same input, so the input's gradient is the sum of the
    ranks' partial gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)  # the same storage: nothing copied, nothing new saved

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()  # all_reduce works in place on a dense tensor
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: sums the ranks' partial outputs; each rank's partial output contributed
    to the sum with weight 1, so the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()  # all_reduce writes in place; the caller's tensor stays as it was
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Conjugate(torch.autograd.Function):
    """One collective forward, its conjugate backward: `op(x, group)` forward and
    `conjugate(grad, group)` backward, the gradient sent back the way the data came.
    Sequence parallelism's pair is one all-gather / reduce-scatter read in both directions
    (`gather_sequence`, `reduce_scatter_sequence`), as lesson 08's Ulysses all-to-alls are."""

    @staticmethod
    def forward(ctx, x, group, op, conjugate):
        ctx.group, ctx.conjugate = group, conjugate
        return op(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.conjugate(grad, ctx.group), None, None, None


class GatherLastDim(torch.autograd.Function):
    """All-gather the ranks' column blocks (..., n/t) -> (..., n); backward keeps this rank's
    block of the gradient (the other columns' gradients belong to the other ranks)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t = dist.get_world_size(group)
        pieces = [torch.empty_like(x) for _ in range(t)]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        t, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(t, dim=-1)[rank].contiguous(), None


class SumOverHolders(torch.autograd.Function):
    """Identity forward on this rank's KV rows; backward sums the gradient over the ranks that
    hold the same rows: each rank writes its rows into a zero (n_kv·d, h) buffer, one all-reduce
    over the tp group adds the holders' partial gradients, each rank keeps its rows. (A subgroup
    of the t/n_kv holders would move less; creating one needs every rank of the job.)"""

    @staticmethod
    def forward(ctx, weight, rows, n_rows, group):
        ctx.rows, ctx.n_rows, ctx.group = rows, n_rows, group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        full = grad.new_zeros((ctx.n_rows, *grad.shape[1:]))
        full[ctx.rows] = grad
        dist.all_reduce(full, group=ctx.group)
        return full[ctx.rows].clone(), None, None, None


def f(x, group):
    """Megatron's f: identity forward, all-reduce of the gradient over `group` backward."""
    return CopyToTensorParallel.apply(x, group)


def g(x, group):
    """Megatron's g: all-reduce over `group` forward, identity backward."""
    return ReduceFromTensorParallel.apply(x, group)


def gather_sequence(x, group):
    """(B, T/t, h) shards -> (B, T, h) on every rank; backward reduce-scatters the gradient back
    to this rank's shard (each rank's full gradient holds a part for every shard)."""
    return Conjugate.apply(x, group, _all_gather_dim1, _reduce_scatter_dim1)


def reduce_scatter_sequence(x, group):
    """Partial (B, T, h) on every rank -> this rank's summed shard (B, T/t, h); backward
    all-gathers the shards' gradients (every rank's partial fed every shard): gather_sequence
    read backwards."""
    return Conjugate.apply(x, group, _reduce_scatter_dim1, _all_gather_dim1)


def gather_last_dim(x, group):
    """Column blocks (..., n/t) -> the whole (..., n) on every rank; no communication backward."""
    return GatherLastDim.apply(x, group)


def g_trap(x, group):
    """The trap: a `g` made of torch's differentiable all-reduce. Its backward all-reduces the
    gradient, which is already the same on every rank, so it comes back multiplied by tp."""
    with warnings.catch_warnings():  # torch 2.13 deprecates this wrapper; the trap is the point
        warnings.simplefilter("ignore", FutureWarning)
        return dist_nn.all_reduce(x, group=group)


def sum_over_holders(weight, rows, n_rows, group):
    """Rows `rows` of an (n_rows, ...) weight that several ranks of `group` hold alike (a GQA
    KV head replicated over t/n_kv ranks): identity forward, the holders' gradients summed backward."""
    return SumOverHolders.apply(weight, rows, n_rows, group)


def sequence_shard(x, group, dim=1):
    """This rank's contiguous 1/t slice of `x` along `dim` (the sequence), no communication."""
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(t, dim=dim)[rank]


def _all_gather_dim1(x, group):
    # all_gather_single stacks along dim 0, so put T first: (T/t, B, h) -> (T, B, h)
    t = dist.get_world_size(group)
    shard = x.transpose(0, 1).contiguous()
    out = shard.new_empty((t * shard.size(0), *shard.shape[1:]))
    dist.all_gather_single(out, shard, group=group)
    return out.transpose(0, 1).contiguous()  # (B, T, h)


def _reduce_scatter_dim1(x, group):
    t = dist.get_world_size(group)
    full = x.transpose(0, 1).contiguous()  # (T, B, h): rank r's shard is rows r*T/t..
    if full.size(0) % t:
        raise ValueError(f"tp {t} does not divide the sequence of {full.size(0)} tokens "
                         f"({full.size(0)} / {t} = {full.size(0) / t:g})")
    out = full.new_empty((full.size(0) // t, *full.shape[1:]))
    dist.reduce_scatter_single(out, full, group=group)
    return out.transpose(0, 1).contiguous()  # (B, T/t, h)
