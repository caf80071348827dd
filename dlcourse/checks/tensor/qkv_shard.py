"""Lesson 04's check of the fused qkv weight's shard (`__init__.py` exports it):

    check_qkv_shard(qkv_shard)       this rank's rows of the fused q, k, v weight, run as attention

The reference is single-process torch in float64: the course GPT's `CausalSelfAttention` on the
whole batch. Cases (2, 3 and 4 ranks, sizes, biases, values) are drawn afresh on every run
(`core.fresh_cases`) from a seed that a failure prints; `seed=` replays it.
"""

import torch
import torch.nn.functional as F

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail,
                                  fresh_cases, kind, run_on_ranks)
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import draw_tp_sizes
from dlcourse.checks.tensor.in_rank import qkv_in_rank
from dlcourse.checks.tensor.layers import TOL, TOLERANCE, capital
from dlcourse.models import CausalSelfAttention, GPTConfig

# The linear checks' float64 tolerance, 1e-10: here one process and the ranks add the same ~100
# products in another order, ~1e-14 apart, 10^4 times less. Each mistake named here moves values
# by 0.01 or more.


# ---------------------------------------------------------------- exercise 5: the fused qkv

QKV_HINT = ("the weight is [W_q; W_k; W_v], each (h, h), its rows head after head: cut each of "
            "the three into t blocks of rows (W_q.chunk(t, dim=0)[rank], ...) and stack this "
            "rank's three blocks, [q_r; k_r; v_r]; the same for the bias")


@fresh_cases
def check_qkv_shard(qkv_shard, timeout=CHECK_TIMEOUT_S, *, rng):
    """qkv_shard(qkv, group): qkv the attention's fused nn.Linear(h, 3h) -> (weight, bias) of
    this rank, the rows [q_r; k_r; v_r] of its heads r a/t .. (r+1) a/t - 1: (3h/t, h) and
    (3h/t,), or None for the bias of a layer without one. Run as attention heads on each rank,
    summed over the ranks by the output projection, it must equal the plain attention."""
    __tracebackhide__ = True
    expect_callable(qkv_shard, "qkv_shard")
    for i, tp in enumerate(draw_tp_sizes(rng)):
        n_heads, head_dim = tp * rng.randint(1, 2), rng.randint(1, 3)
        config = GPTConfig(vocab_size=8, seq_len=rng.randint(2, 5), n_layers=1, n_heads=n_heads,
                           hidden=n_heads * head_dim, bias=i != 1)
        torch.manual_seed(rng.randrange(10**6))
        attn = CausalSelfAttention(config).to(torch.float64)
        x = torch.randn(rng.randint(1, 2), config.seq_len, config.hidden, dtype=torch.float64)
        where = (f"qkv_shard on {tp} ranks, {n_heads} heads of {head_dim} (h = {config.hidden}), "
                 f"{'with' if config.bias else 'no'} bias")
        outcomes = run_on_ranks(qkv_shard, [(attn, x)] * tp, exercise="qkv_shard", where=where,
                                hint=QKV_HINT, harness=qkv_in_rank, guard=ANSWERS.in_rank,
                                timeout=timeout)
        shards = [got for got, _ in outcomes]
        for rank, got in enumerate(shards):
            _expect_shard(got, attn.qkv, tp, rank, where)
        _expect_attention(attn, shards, x, tp, where)
    print("qkv_shard: passed on 3 cases drawn afresh (2, 3 and 4 ranks; 1 or 2 heads "
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
                + capital(QKV_HINT))
    if b is not None and torch.equal(b, qkv.bias.detach().chunk(tp)[rank]):
        return ("the weight is right, but the bias was cut into contiguous blocks. "
                + capital(QKV_HINT))
    return QKV_HINT
