"""Lesson 04's checks of the parallel layers' pieces (`__init__.py` exports them):

    check_qkv_shard(qkv_shard)       this rank's rows of the fused q, k, v weight, run as attention
    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy)
                                     the loss and its gradient, the logits never gathered

The references are single-process torch in float64: the course GPT's `CausalSelfAttention` on the
whole batch, and `F.cross_entropy` of the whole logits. Cases (2, 3 and 4 ranks, sizes, biases,
values) are drawn afresh on every run from a seed that a failure prints; `seed=` replays it.
"""

import torch
import torch.nn.functional as F

from dlcourse.checks.core import (CHECK_TIMEOUT_S, draw, expect_callable, expect_tensor, fail,
                                  kind, random_tensor, run_on_ranks)
from dlcourse.checks.tensor_parallel.in_rank import loss_in_rank, qkv_in_rank
from dlcourse.checks.tensor_parallel.refused import TENSOR, draw_tp_sizes, wide_seed
from dlcourse.models import CausalSelfAttention, GPTConfig

# float64 rounding: one process and the ranks add the same ~100 products in another order,
# ~1e-14 apart; 1e-10 allows 10^4 times that. Each mistake named here moves values by 0.01 or more.
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"


def _close(a, b):
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, **TOL)


def _capital(text):
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------- exercise 5: the fused qkv

QKV_HINT = ("the weight is [W_q; W_k; W_v], each (h, h), its rows head after head: cut each of "
            "the three into t blocks of rows (W_q.chunk(t, dim=0)[rank], ...) and stack this "
            "rank's three blocks, [q_r; k_r; v_r]; the same for the bias")


def check_qkv_shard(qkv_shard, seed=None, timeout=CHECK_TIMEOUT_S):
    """qkv_shard(qkv, group): qkv the attention's fused nn.Linear(h, 3h) -> (weight, bias) of
    this rank, the rows [q_r; k_r; v_r] of its heads r a/t .. (r+1) a/t - 1: (3h/t, h) and
    (3h/t,), or None for the bias of a layer without one. Run as attention heads on each rank,
    summed over the ranks by the output projection, it must equal the plain attention."""
    __tracebackhide__ = True
    expect_callable(qkv_shard, "qkv_shard")
    seed, rng = draw(seed)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        n_heads, head_dim = tp * rng.randint(1, 2), rng.randint(1, 3)
        config = GPTConfig(vocab_size=8, seq_len=rng.randint(2, 5), n_layers=1, n_heads=n_heads,
                           hidden=n_heads * head_dim, bias=i != 1)
        torch.manual_seed(rng.randrange(10**6))
        attn = CausalSelfAttention(config).to(torch.float64)
        x = torch.randn(rng.randint(1, 2), config.seq_len, config.hidden, dtype=torch.float64)
        where = (f"qkv_shard on {tp} ranks, {n_heads} heads of {head_dim} (h = {config.hidden}), "
                 f"{'with' if config.bias else 'no'} bias, seed {seed}")
        outcomes = run_on_ranks(qkv_shard, [(attn, x)] * tp, exercise="qkv_shard", where=where,
                                hint=QKV_HINT, harness=qkv_in_rank, guard=TENSOR.in_rank,
                                timeout=timeout)
        shards = [got for got, _ in outcomes]
        for rank, got in enumerate(shards):
            _expect_shard(got, attn.qkv, tp, rank, where)
        _expect_attention(attn, shards, x, tp, where)
    print(f"qkv_shard: passed on 3 cases drawn with seed {seed} (2, 3 and 4 ranks; 1 or 2 heads "
          "a rank; with and without bias): every rank's heads, summed, equal the course GPT's "
          "attention")


def _expect_attention(attn, shards, x, tp, where):
    """Every rank's heads from the shard it returned, through its columns of the output
    projection, summed over the ranks (as the ranks' all-reduce would), must be the attention;
    if not, the first rank whose heads differ from those of its rows of q, k and v is named."""
    __tracebackhide__ = True
    terms = [_heads(attn, w, b, x, rank, tp) for rank, (w, b) in enumerate(shards)]  # (B, T, h)
    bias = 0 if attn.proj.bias is None else attn.proj.bias.detach()
    expected, whole = attn(x).detach(), f"{where}: the attention of every rank's heads"
    if torch.allclose(sum(terms) + bias, expected, **TOL):
        return
    for rank, (got, term) in enumerate(zip(shards, terms)):
        rows = _rows_of_heads(attn.qkv, tp, rank)
        expect_tensor(term, _heads(attn, *rows, x, rank, tp), where=whole, rank=rank,
                      tolerance=TOLERANCE, hint=_qkv_hint(got, attn.qkv, tp, rank), **TOL)
    expect_tensor(sum(terms) + bias, expected, where=whole, rank=0, tolerance=TOLERANCE,
                  hint=QKV_HINT, **TOL)


def _rows_of_heads(qkv, tp, rank):
    """(weight, bias) rows [q_r; k_r; v_r] of rank's heads: to name the rank that is off."""
    def rows(t):
        return torch.cat([part.chunk(tp, dim=0)[rank] for part in t.detach().chunk(3, dim=0)])
    return rows(qkv.weight), None if qkv.bias is None else rows(qkv.bias)


def _heads(attn, w, b, x, rank, tp):
    """This rank's attention heads from its qkv rows, times its columns of the projection."""
    B, T, h = x.shape
    a_r, hs = attn.n_heads // tp, h // attn.n_heads  # heads on this rank, their size
    q, k, v = F.linear(x, w, b).split(a_r * hs, dim=-1)  # each (B, T, h/t)
    q, k, v = (t.view(B, T, a_r, hs).transpose(1, 2) for t in (q, k, v))  # (B, a/t, T, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, a/t, T, hs)
    y = y.transpose(1, 2).reshape(B, T, a_r * hs)
    columns = attn.proj.weight.detach()[:, rank * a_r * hs:(rank + 1) * a_r * hs]  # (h, h/t)
    return F.linear(y, columns)


def _expect_shard(got, qkv, tp, rank, where):
    __tracebackhide__ = True
    if not (isinstance(got, tuple) and len(got) == 2):
        fail(where, rank, f"returned {kind(got)}, expected a pair (weight, bias)", QKV_HINT)
    w, b = got
    rows, h = qkv.out_features // tp, qkv.in_features
    if not isinstance(w, torch.Tensor) or w.shape != (rows, h):
        hint = QKV_HINT
        if isinstance(w, torch.Tensor) and w.shape == (3 * h, h // tp):
            hint = ("this cuts the weight's columns (input features): every head needs all h "
                    "inputs. Cut rows (dim 0), the output features q, k and v are made of: "
                    + QKV_HINT)
        fail(where, rank, f"returned a weight of {kind(w)}, expected ({rows}, {h}): 3 h / t rows "
                          "of h inputs", hint)
    if qkv.bias is None and b is not None:
        fail(where, rank, f"returned a bias ({kind(b)}) for a layer without one: return None",
             QKV_HINT)
    if qkv.bias is not None and (not isinstance(b, torch.Tensor) or b.shape != (rows,)):
        fail(where, rank, f"returned a bias of {kind(b)}, expected shape ({rows},)", QKV_HINT)


def _qkv_hint(got, qkv, tp, rank):
    w, b = got
    if torch.equal(w, qkv.weight.detach().chunk(tp, dim=0)[rank]):
        h = qkv.in_features
        return (f"the fused weight was cut into {tp} contiguous blocks of rows: rank 0's block, "
                f"rows 0..{3 * h // tp - 1}, holds q for the heads of several ranks (rows "
                f"0..{h - 1} are q, then k, then v), not its own heads of q, k and v. "
                + _capital(QKV_HINT))
    if b is not None and torch.equal(b, qkv.bias.detach().chunk(tp)[rank]):
        return ("the weight is right, but the bias was cut into contiguous blocks. "
                + _capital(QKV_HINT))
    return QKV_HINT


# ---------------------------------------------------------------- exercise 6: the loss

LOSS_HINT = ("take m, the max of the logits over the whole vocabulary (all-reduce MAX of each "
             "row's max, no gradient); the sum of exp(logit - m) and the target's logit - m (0 "
             "on the ranks that do not hold the target) each summed over the ranks with your g "
             "(MegatronG.apply); loss = mean(log(sum) - target's (logit - m))")


def check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, seed=None,
                                       timeout=CHECK_TIMEOUT_S):
    """vocab_parallel_cross_entropy(logits, targets, group): logits (N, V/t), this rank's
    vocabulary ids r V/t .. (r+1) V/t - 1; targets (N,) ids in 0..V-1 -> the mean cross-entropy,
    the same on every rank, differentiable: backward gives each rank its logits' gradient.
    The collectives, forward and backward together, must move fewer bytes than a rank's
    (N, V/t) logits: the loss never gathers them."""
    __tracebackhide__ = True
    name = "vocab_parallel_cross_entropy"
    expect_callable(vocab_parallel_cross_entropy, name)
    seed, rng = draw(seed)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        n, per_rank = rng.randint(3, 12), rng.randint(8, 12)
        logits = 3 * random_tensor((n, tp * per_rank), torch.float64, wide_seed(rng))
        if i == 0:
            logits[::2] += 750.0  # exp(750) overflows float64: the max must come off first
        targets = torch.tensor([rng.randrange(tp * per_rank) for _ in range(n)])
        where = (f"{name} on {tp} ranks, {n} tokens, vocabulary {tp * per_rank} ({per_rank} a "
                 f"rank){', logits near 750' if i == 0 else ''}, seed {seed}")
        whole = logits.clone().requires_grad_()
        loss = F.cross_entropy(whole, targets)  # one process, the whole logits
        loss.backward()
        outcomes = run_on_ranks(vocab_parallel_cross_entropy,  # rank r: its (N, V/t) only
                                [(mine.clone(), targets) for mine in logits.chunk(tp, dim=-1)],
                                exercise=name, where=where, hint=LOSS_HINT,
                                harness=loss_in_rank, guard=TENSOR.in_rank,
                                timeout=timeout)
        for rank, (got, _) in enumerate(outcomes):
            _expect_loss(got, loss.detach(), whole.grad.chunk(tp, dim=-1)[rank],
                         logits.chunk(tp, dim=-1)[rank], targets, tp, rank, where)
    print(f"{name}: passed on 3 cases drawn with seed {seed} (2, 3 and 4 ranks; logits near 750 "
          "included): the loss and every rank's gradient equal F.cross_entropy's, no logits "
          "gathered")


def _expect_loss(got, loss, grad, mine, targets, tp, rank, where):
    __tracebackhide__ = True
    value, got_grad, backward, collectives = got
    whole = mine.numel() * mine.element_size()  # one rank's logits, in bytes
    moved = sum(nbytes for _, nbytes in collectives)  # forward and backward, all collectives
    if moved >= whole:  # the three sums of N numbers move at most 3/8 of it (V/t >= 8)
        op, largest = max(collectives, key=lambda c: c[1])
        fail(where, rank, f"moved {moved} bytes in {len(collectives)} collectives (the largest "
                          f"a {largest}-byte {op}), as much as a rank's whole logits "
                          f"({tuple(mine.shape)}, {whole} bytes): the loss must not gather the "
                          "logits", "communicate only a few numbers per token: " + LOSS_HINT)
    least = 2 * len(targets) * mine.element_size()  # the normalizer and the target's logit
    if moved < least:  # of each token, from other ranks: no collective brings less
        fail(where, rank, f"moved {moved} bytes in {len(collectives)} collectives, less than "
                          f"{least}: every rank needs, for each of the {len(targets)} tokens, the "
                          "whole vocabulary's sum of exp and the target's logit, which only "
                          "collectives may bring (data moved another way does not count)",
             LOSS_HINT)
    hint = LOSS_HINT
    if isinstance(value, torch.Tensor) and not torch.isfinite(value).all():
        hint = ("exp of a logit near 750 overflows: subtract the max over the whole vocabulary "
                "(an all-reduce with op=dist.ReduceOp.MAX) before exp. " + _capital(LOSS_HINT))
    expect_tensor(value, loss, where=f"{where}, the loss", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
    if not backward:
        fail(f"{where}, backward", rank, "the loss does not require grad, so backward cannot "
             "reach the logits: compute it from `logits` with differentiable operations (the "
             "max may be detached) and sum over the ranks with your MegatronG", LOSS_HINT)
    hint = LOSS_HINT
    if _close(got_grad, tp * grad):
        hint = (f"the gradient is {tp} times too large: a sum made with torch's differentiable "
                "all_reduce all-reduces in backward too; sum with your MegatronG instead")
    expect_tensor(got_grad, grad, where=f"{where}, backward: logits.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)

