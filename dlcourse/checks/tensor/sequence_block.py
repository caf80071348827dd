"""The block lesson 04's two sequence-parallel checks run (`sequence_parallel.py`,
`sync_layernorm_grads.py`), and its one-process reference.

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) keeps the activations outside the
tensor-parallel region cut along the sequence: rank r holds tokens r T/t .. (r+1) T/t - 1 of
(B, T, h). Both checks run the same block on t = 2, 3, 4 real ranks, in float64:

    x_r (B, T/t, h) -> LayerNorm -> gather -> column-parallel Linear(h, f) -> gelu
        -> row-parallel Linear(f, h, no bias) -> reduce-scatter -> y_r (B, T/t, h)

against one process running LayerNorm, Linear, gelu, Linear on the whole (B, T, h). Each rank is
sent its tokens, its rows or columns of the weights and its tokens' upstream gradient only. The
collectives are counted by kind and bytes (`CommCounter`): the pair makes, in forward and again
in backward, one all-gather and one reduce-scatter of the whole (B, T, h), nothing else; the
LayerNorm's gradients take one all-reduce of its 2h numbers. `answers.ANSWERS` is refused while
the student's code runs (exercise 8's block runs the lesson's pair before that). And what each
rank received is counted by the kernel, outside it: for the pair, no more than torch's own
all-gathers and reduce-scatters of the same tensors receive (gloo's reduce-scatter receives about
what an all-reduce does, so the measure is torch's, not a formula) and HEADER_ROOM a peer, on 3
and 4 ranks with shards of 2 WIRE_FLOOR bytes or more: every rank's whole tensor gathered where a
reduce-scatter belongs fails, whatever the rank's own counter says. The LayerNorm's
gradients the same way: no more than torch's all-reduce of them receives, on 3 and 4 ranks with
h of 512 or more (4 WIRE_FLOOR bytes).
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.checks.core import random_tensor
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import wide_seed


# float64: a value is a LayerNorm and two dot products of at most ~40 terms of size ~1, rounded
# differently by one process and a rank, ~1e-14; 1e-10 allows 10^4 times that. The mistakes named
# here move values by 0.01 or more (a share of the tokens, a factor t).
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"


SEQUENCE = ANSWERS.but(allow=ANSWERS.allow + ("_shape_checked", "_block"))  # the harness's


def draw_block(rng, tp, h_bytes=0, h_least=0):
    """(x, ln, a, b, upstream): B 1-2, T = tp k, h 2-5, f = tp j; float64, fresh seeds. With
    `h_bytes`, h wide enough that a rank's (B, T/t, h) shard holds that many bytes or more; with
    `h_least`, h that or more."""
    B, T, h = rng.randint(1, 2), tp * rng.randint(1, 3), rng.randint(2, 5)
    h = max(h, h_least, -(-h_bytes // (8 * B * T // tp)))
    f = tp * rng.randint(1, 3)
    ln, a, b = (nn.LayerNorm(h, dtype=torch.float64), nn.Linear(h, f, dtype=torch.float64),
                nn.Linear(f, h, bias=False, dtype=torch.float64))
    with torch.no_grad():
        for p in (*ln.parameters(), *a.parameters(), *b.parameters()):
            p.copy_(random_tensor(p.shape, torch.float64, wide_seed(rng)))
    x = random_tensor((B, T, h), torch.float64, wide_seed(rng))
    return x, ln, a, b, random_tensor((B, T, h), torch.float64, wide_seed(rng))


def reference(x, ln, a, b, upstream):
    """One process, the whole sequence: y and every gradient."""
    x = x.clone().requires_grad_()
    y = b(F.gelu(a(ln(x))))
    (y * upstream).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in
             [("ln.weight", ln.weight), ("ln.bias", ln.bias), ("a.weight", a.weight),
              ("a.bias", a.bias), ("b.weight", b.weight)]}
    return y.detach(), x.grad.detach(), grads


def own_ln_grads(x, ln, a, b, upstream, tp):
    """[per rank: {"weight", "bias"}]: the LayerNorm gradients rank r holds after the
    sequence-parallel block's backward, before they are synced: its tokens' share of the sum
    (one process, each rank's tokens through a LayerNorm copy of its own)."""
    copies = [copy.deepcopy(ln) for _ in range(tp)]
    normed = torch.cat([c(t) for c, t in zip(copies, x.chunk(tp, dim=1))], dim=1)  # (B, T, h)
    (b(F.gelu(a(normed))) * upstream).sum().backward()
    a.zero_grad(), b.zero_grad()  # a and b are the check's: their gradients are not kept
    return [{"weight": c.weight.grad.detach().clone(), "bias": c.bias.grad.detach().clone()}
            for c in copies]


def rank_args(x, ln, a, b, upstream, tp):
    """Rank r's tokens, the LayerNorm (whole: it is replicated), its rows of A and of A's bias,
    its columns of B, its tokens' upstream gradient."""
    cut = lambda t, dim: [c.detach().clone() for c in t.chunk(tp, dim=dim)]  # noqa: E731
    xs, ups = cut(x, 1), cut(upstream, 1)
    a_w, a_b, b_w = cut(a.weight, 0), cut(a.bias, 0), cut(b.weight, 1)
    ln_state = (ln.weight.detach().clone(), ln.bias.detach().clone())
    return [(xs[r], ln_state, a_w[r], a_b[r], b_w[r], ups[r]) for r in range(tp)]
