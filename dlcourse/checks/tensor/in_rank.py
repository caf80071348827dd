"""The rank side of lesson 04's checks: what runs in each rank while a student's function runs
there. It imports none of the lesson's code (`dlcourse.parallel.tensor`) and holds no
reference: under `dlcourse grade` this is the one module of the set a rank loads
(`answers.ANSWERS.rank_side`, `grading/absent.py`); the whole layers and their gradients are computed
in the checking process, and so are the LayerNorm gradients a rank holds before the student
syncs them (`sequence.own_ln_grads`), where the lesson's sequence-parallel pair made them.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.checks.core import kind
from dlcourse.collectives.counter import CommCounter


def _detached(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _grad(t):
    return None if t.grad is None else t.grad.detach().clone()


def _records(comm):
    return [(r.op, r.nbytes) for r in comm.records]


# ---------------------------------------------------------------- linear layers, f and g


def column_in_rank(student, x, w_r, b_r):
    """Runs in every rank, which holds x (..., in), its rows of W (out/t, in) and its entries
    of b (out/t,) only: the student's output."""
    return _detached(student(x, w_r, b_r, dist.group.WORLD))


def row_in_rank(student, x, w_r, b):
    """Runs in every rank, which holds x (..., in), its columns of W (out, in/t) and the whole
    bias (out,) only: the student's output."""
    return _detached(student(x, w_r, b, dist.group.WORLD))


def _is_function_class(fn):
    return isinstance(fn, type) and issubclass(fn, torch.autograd.Function)


def _not_a_function_class(fn):
    return (f"the check needs your autograd Function class itself (class ...("
            f"torch.autograd.Function) with forward and backward), not {kind(fn)}")


def _apply(student, x):
    """student.fn.apply(x, WORLD), inside the guards, once it is known to be a Function class
    (for a submission, only the rank has it unpickled)."""
    if not _is_function_class(student.fn):
        raise TypeError(_not_a_function_class(student.fn))
    return student.fn.apply(x, dist.group.WORLD)


def f_in_rank(student, x, w_r, up_r):
    """Runs in every rank: y = f(x) feeds this rank's rows of W, w_r (out/t, in), a
    column-parallel layer; the gradient of its output block, up_r (..., out/t), flows back
    through the student's backward."""
    x = x.requires_grad_()
    with student.guarded():  # forward and backward both run the student's code
        y = _apply(student, x)
        if isinstance(y, torch.Tensor) and y.shape == x.shape and y.requires_grad:
            (y @ w_r.T * up_r).sum().backward()
    return _detached(y), _detached(x.grad)


def g_in_rank(student, x_r, w_r, upstream):
    """Runs in every rank: this rank's partial output x_r W_r^T (x_r (..., in/t), W_r (out,
    in/t)) goes through g; every rank then has the same loss, whose gradient must reach W_r
    unchanged."""
    w_r = w_r.requires_grad_()
    partial = x_r @ w_r.T  # (..., out)
    before = partial.detach().clone()  # g must leave the caller's tensor as it was
    with student.guarded():
        y = _apply(student, partial)
        changed = not torch.equal(partial.detach(), before)
        if isinstance(y, torch.Tensor) and y.shape == partial.shape and y.requires_grad:
            (y * upstream).sum().backward()
    return _detached(y), _detached(w_r.grad), changed


# ---------------------------------------------------------------- the qkv shard, the loss


def qkv_in_rank(student, attn, x):
    """Runs in every rank: the student's shard, as data. The attention of the shards is computed
    by the check in its own process (`_expect_attention`), where the student's code never ran
    and cannot have changed a helper or a torch function the check uses."""
    got = student(attn.qkv, dist.group.WORLD)
    return tuple(_detached(t) for t in got) if isinstance(got, (tuple, list)) else _detached(got)


def loss_in_rank(student, mine, targets):
    """Runs in every rank, which holds its logits (N, V/t) and the targets (N,) only: the
    student's loss, its backward, and the size of every collective both made."""
    mine = mine.requires_grad_()
    with CommCounter() as comm, student.guarded():  # the backward runs the student's code too
        loss = student.fn(mine, targets.clone(), dist.group.WORLD)
        backward = isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad
        if backward:
            loss.backward()
    return _detached(loss), _detached(mine.grad), backward, [(r.op, r.nbytes) for r in
                                                             comm.records]


# ---------------------------------------------------------------- sequence parallelism


def _block(x_r, ln_state, a_w, a_b, b_w, gather, scatter):
    """A rank's forward: (y_r, x_r with grad, its LayerNorm, its A and B weights)."""
    x_r = x_r.requires_grad_()
    ln = nn.LayerNorm(ln_state[0].shape[0], dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(ln_state[0]), ln.bias.copy_(ln_state[1])
    a_w, a_b, b_w = (t.requires_grad_() for t in (a_w, a_b, b_w))
    full = gather(ln(x_r), dist.group.WORLD)  # (B, T, h)
    partial = F.gelu(full @ a_w.T + a_b) @ b_w.T  # (B, T, h): this rank's term of the sum
    return scatter(partial, dist.group.WORLD), x_r, ln, (a_w, a_b, b_w)


def pair_in_rank(student, x_r, ln_state, a_w, a_b, b_w, up_r, other):
    """Runs in every rank: the block with the student's pair (both classes inside their guards),
    forward and backward counted apart."""
    with student.guarded(), other.guarded():
        for fn in (student.fn, other.fn):
            if not (isinstance(fn, type) and issubclass(fn, torch.autograd.Function)):
                raise TypeError(f"expected an autograd Function class, got {kind(fn)}")
        t, (B, T_t, h) = dist.get_world_size(), x_r.shape
        gather = _shape_checked(student.fn.apply, "GatherSequence", (B, T_t * t, h))
        scatter = _shape_checked(other.fn.apply, "ReduceScatterSequence", (B, T_t, h))
        with CommCounter() as forward:
            y_r, x_r, ln, (a_w, a_b, b_w) = _block(x_r, ln_state, a_w, a_b, b_w, gather, scatter)
        with CommCounter() as backward:
            if isinstance(y_r, torch.Tensor) and y_r.shape == up_r.shape and y_r.requires_grad:
                (y_r * up_r).sum().backward()
    return {"y": y_r.detach().clone() if isinstance(y_r, torch.Tensor) else None,
            "x": _grad(x_r), "a.weight": _grad(a_w), "a.bias": _grad(a_b),
            "b.weight": _grad(b_w), "forward": _records(forward),
            "backward": _records(backward)}


def _shape_checked(apply, name, shape):
    """`apply`, failing at once (in the rank) if its output is not of `shape`."""
    def call(x, group):
        out = apply(x, group)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else kind(out)
            raise ValueError(f"{name}.apply on {tuple(x.shape)} returned {got}, expected "
                             f"{shape}: the shards are cut along the sequence, dim 1 of (B, T, h)")
        return out
    return call


def sync_in_rank(student, ln_state, own):
    """Runs in every rank: a LayerNorm holding this rank's own gradients (`own`: its tokens'
    share, computed by the check in its process, as the sequence-parallel block's backward
    leaves them), then the student's function on it (inside its guards), its collectives
    counted."""
    ln = nn.LayerNorm(ln_state[0].shape[0], dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(ln_state[0]), ln.bias.copy_(ln_state[1])
    ln.weight.grad, ln.bias.grad = own["weight"].clone(), own["bias"].clone()
    with CommCounter() as comm:
        student(ln, dist.group.WORLD)
    return {"weight": _grad(ln.weight), "bias": _grad(ln.bias), "own": own,
            "params": (ln.weight.detach().clone(), ln.bias.detach().clone()),
            "collectives": _records(comm)}
