"""Checks for lesson 09's routing exercises (`exercises/09_experts.ipynb`), formulas called here:

    check_route_with_capacity(route_with_capacity)   top-k, renormalised weights, the capacity queue
    check_load_balance_loss(load_balance_loss)       Switch's E · Σ f_e · P_e, value and gradient

Cases are drawn afresh on each run (tokens, experts, k, capacity; router logits in float64, skewed
so that some experts are crowded); the references (`reference.py`) are computed after the
student's function has returned. Probabilities never tie in these cases (continuous random
logits), except where the loss's value does not depend on the tie: uniform routing.
"""

import math

import torch

from dlcourse.checks.core import (as_tensor, call_in_process, expect_callable, fail, fresh_cases,
                                  kind)
from dlcourse.checks.expert.answers import ANSWERS
from dlcourse.checks.expert.in_rank import loss_and_grad
from dlcourse.checks.expert.reference import routed, switch_loss

# float64 softmax, a sum of k values and one division: rounding ~1e-16 relative; 1e-12 leaves
# room for another order of the same operations (a softmax over the k chosen logits instead)
RTOL = 1e-12


def draw_logits(rng, n_tokens, n_experts, skew=True):
    """(N, E) float64 router logits; with skew, a few favourite experts get +1 to +3."""
    gen = torch.Generator().manual_seed(rng.randrange(2**62))
    logits = torch.randn(n_tokens, n_experts, generator=gen, dtype=torch.float64)
    if skew:
        for e in rng.sample(range(n_experts), max(1, n_experts // 3)):
            logits[:, e] += rng.uniform(1, 3)
    return logits


# ---------------------------------------------------------------- exercise 1: top-k with capacity

ROUTE_HINT = ("softmax over each token's E logits (dim=-1), the k largest probabilities with "
              "torch.topk, divided by their sum; then each expert's queue: all first choices in "
              "token order, then all second choices, ...; the first `capacity` are kept")


@fresh_cases
def check_route_with_capacity(route_with_capacity, *, rng):
    """route_with_capacity(logits (N, E), k, capacity) -> (experts (N, k), weights (N, k),
    keep (N, k) bool), against `reference.routed`."""
    __tracebackhide__ = True
    expect_callable(route_with_capacity, "route_with_capacity")
    cases = []
    for i in range(5):
        E = rng.randint(3, 8)
        k = 1 if i == 1 else rng.randint(2, min(E, 3))
        N = rng.randint(6, 24)
        # case 2 at half capacity: drops whatever the routing (E·C < k·N)
        factor = None if i == 0 else 0.5 if i == 2 else rng.choice([0.5, 0.75, 1.0, 1.25])
        cap = None if factor is None else max(1, math.ceil(factor * k * N / E))
        for _ in range(100):  # case 2: until the queue's order matters (most draws do)
            logits = draw_logits(rng, N, E)
            if i != 2 or _order_matters(logits, k, cap):
                break
        cases.append((logits, k, cap))
    for logits, k, cap in cases:
        N, E = logits.shape
        where = f"route_with_capacity(logits ({N}, {E}) float64, k={k}, capacity={cap})"
        got = call_in_process(route_with_capacity, (logits.clone(), k, cap),
                              exercise="route_with_capacity", where=where,
                              guard=ANSWERS.in_process, hint=ROUTE_HINT)
        _expect_routed(got, logits, k, cap, where)
    drops = sum(int((~routed(lg, k, c)[2]).sum()) for lg, k, c in cases)
    print(f"route_with_capacity: passed on {len(cases)} cases drawn at random (E from "
          f"{min(c[0].size(1) for c in cases)} to {max(c[0].size(1) for c in cases)}, k = "
          f"{', '.join(str(c[1]) for c in cases)}; dropless and 4 capacities, {drops} "
          "assignments dropped in all): experts, renormalised weights and the capacity queue")


def _expect_routed(got, logits, k, cap, where):
    __tracebackhide__ = True
    N, E = logits.shape
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        fail(where, None, f"returned {kind(got)}, expected (experts, weights, keep)", ROUTE_HINT)
    experts, weights, keep = got
    # a list or numpy array comes back as nested lists: read its numbers as float64, not float32
    experts, keep = as_tensor(experts), as_tensor(keep)
    weights = as_tensor(weights, None if isinstance(weights, torch.Tensor) else torch.float64)
    want_e, want_w, want_k = routed(logits, k, cap)
    for name, t in (("experts", experts), ("weights", weights), ("keep", keep)):
        if t is None or t.shape != (N, k):
            shape = "nothing tensor-like" if t is None else f"shape {tuple(t.shape)}"
            fail(where, None, f"returned {name} of {shape}, expected shape ({N}, {k}): one row "
                              f"per token, one column per choice", _shape_hint(t, k))
    if not torch.equal(experts.to(torch.int64), want_e):
        rows = (experts.to(torch.int64) != want_e).any(dim=1)
        fail(where, None, _first_row_differing("experts", experts, want_e, rows),
             _experts_hint(experts.to(torch.int64), logits, k))
    close = torch.isclose(weights.to(torch.float64), want_w, rtol=RTOL, atol=0)
    if not bool(close.all()):
        probs = torch.softmax(logits, dim=1).gather(1, want_e)
        hint = ("these are the chosen probabilities as they are: renormalise them to sum to 1 "
                "over the k chosen" if torch.allclose(weights.to(torch.float64), probs,
                                                      rtol=RTOL) else ROUTE_HINT)
        fail(where, None, _first_row_differing("weights", weights, want_w, ~close.all(dim=1))
             + f" (float64 rounding allows a relative {RTOL:g})", hint)
    if not torch.equal(keep.to(torch.bool), want_k):
        rows = (keep.to(torch.bool) != want_k).any(dim=1)
        fail(where, None, _first_row_differing("keep", keep.to(torch.bool), want_k, rows),
             _keep_hint(keep.to(torch.bool), want_e, cap, E))


def _shape_hint(t, k):
    if t is not None and t.dim() >= 1 and t.shape[-1] == 1 and k > 1:
        return f"that is top-1: every token goes to its k = {k} most likely experts"
    return ROUTE_HINT


def _first_row_differing(name, got, want, rows):
    """'<name> of token n is [...], expected [...]': rows (N,) bool marks the tokens that differ."""
    n = int(rows.nonzero()[0])
    return (f"{name} of token {n} is {got[n].tolist()}, expected {want[n].tolist()} "
            f"({int(rows.sum())} of {want.size(0)} tokens differ)")


def _experts_hint(experts, logits, k):
    wrong_dim = torch.softmax(logits, dim=0).topk(k, dim=1).indices
    if torch.equal(experts, wrong_dim):
        return ("that softmax is over the tokens (dim 0): the router's softmax is over each "
                "token's E experts (dim -1)")
    want = routed(logits, k)[0]
    if torch.equal(experts.sort(dim=1).values, want.sort(dim=1).values):
        return "the right experts in another order: slot 0 is the most likely, then descending"
    return ROUTE_HINT


def _keep_hint(keep, experts, cap, n_experts):
    if cap is not None and bool(keep.all()):
        return (f"everything was kept, but each expert takes at most capacity = {cap} "
                "assignments: the rest are dropped")
    if cap is None:
        return "capacity None means dropless: keep every assignment"
    token_major = _keep_token_major(experts, cap, n_experts)
    if torch.equal(keep, token_major):
        return ("that queue is token by token (token 0's choices, then token 1's): the queue "
                "holds every token's first choice before any second choice")
    return ("each expert keeps the first `capacity` of its queue (places 0 to capacity - 1): "
            "first choices in token order, then second choices, ...; a dropped one still "
            "counts in the queue")


def _order_matters(logits, k, cap):
    """Whether a queue ordered token by token keeps other assignments than the choice-major one:
    one case is drawn so, so that such an answer always fails."""
    experts, _, keep = routed(logits, k, cap)
    return not torch.equal(keep, _keep_token_major(experts, cap, logits.size(1)))


def _keep_token_major(experts, cap, n_experts):
    taken, keep = [0] * n_experts, torch.ones_like(experts, dtype=torch.bool)
    for n in range(experts.size(0)):
        for j in range(experts.size(1)):
            e = int(experts[n, j])
            keep[n, j] = taken[e] < cap
            taken[e] += 1
    return keep


# ---------------------------------------------------------------- exercise 2: load-balance loss

AUX_HINT = ("P_e: the router's probability of e averaged over the N tokens; f_e: the share of "
            "the N·k top-k choices that picked e, a count (no gradient); the loss is "
            "E · Σ_e f_e · P_e")


@fresh_cases
def check_load_balance_loss(load_balance_loss, *, rng):
    """load_balance_loss(logits (N, E), k) -> 0-dim tensor E · Σ_e f_e · P_e (Switch eq. 4-6),
    differentiable w.r.t. the logits through P only; against `reference.switch_loss`."""
    __tracebackhide__ = True
    expect_callable(load_balance_loss, "load_balance_loss")
    cases = []
    for i in range(4):
        E = rng.randint(2, 8)
        k = 1 if i == 0 else 2 if i == 1 else rng.randint(1, min(E, 3))
        N = rng.randint(6, 30)
        cases.append((draw_logits(rng, N, E), k, False))
    E, N = rng.randint(2, 8), rng.randint(4, 12)
    cases.append((torch.full((N, E), rng.uniform(-1, 1), dtype=torch.float64),
                  rng.randint(1, E), True))  # uniform routing: every probability 1/E
    for logits, k, uniform in cases:
        N, E = logits.shape
        where = (f"load_balance_loss(logits ({N}, {E}) float64{', all equal' if uniform else ''},"
                 f" k={k})")
        leaf = logits.clone().requires_grad_()
        got = call_in_process(load_balance_loss, (leaf, k), exercise="load_balance_loss",
                              where=where, guard=ANSWERS.in_process, hint=AUX_HINT,
                              answer=loss_and_grad)
        _expect_loss(got, logits, k, uniform, where)
    sizes = [c[0].size(1) for c in cases]
    print(f"load_balance_loss: passed on {len(cases)} cases drawn at random (E from "
          f"{min(sizes)} to {max(sizes)}, k = " + ", ".join(str(c[1]) for c in cases)
          + "), value and gradient equal to a "
          "float64 reference; 1 at uniform routing")


def _expect_loss(got, logits, k, uniform, where):
    __tracebackhide__ = True
    if got["why"]:
        fail(where, None, f"returned {got['why']}, expected a one-element tensor (the loss, "
                          "with its graph: it trains the router)", AUX_HINT)
    want, want_grad = switch_loss(logits, k)
    value, N, E = got["value"], *logits.shape
    if not math.isclose(value, float(want), rel_tol=RTOL):
        fail(where, None, f"returned {value:.12g}, expected {float(want):.12g}"
                          + (" (uniform routing: 1 whatever the ties)" if uniform else ""),
             _loss_hint(value, float(want), logits, k))
    if uniform:  # the gradient depends on how ties are broken: not compared
        return
    grad = got["grad"]
    if grad is None:
        fail(where, None, "returned a loss with no gradient w.r.t. the logits: it is what "
                          "pushes the router towards balance", "P_e must keep its graph: "
                          "average the softmax output itself, not a detached copy")
    if not torch.allclose(grad.to(torch.float64), want_grad, rtol=1e-9, atol=1e-15):
        fail(where, None, f"the right value, but its gradient w.r.t. the logits differs (max "
                          f"|Δ| {(grad - want_grad).abs().max():.3g}; tolerance: float64 "
                          "rounding, rtol 1e-9)",
             "f_e is a count of top-k choices and carries no gradient; only P_e, the mean of "
             "the softmax, does")


def _loss_hint(value, want, logits, k):
    N, E = logits.shape
    if math.isclose(value, want, rel_tol=1e-6):
        return ("within float32 rounding of it: compute in the logits' dtype, float64 (in "
                "torch a whole-number tensor divided by a number is float32)")
    for factor, hint in ((1 / E, "that is 1/E of it: the loss is E · Σ f_e · P_e, so that it "
                                 "is 1 when routing is uniform"),
                         (k, f"that is k = {k} times too large: f_e is the share of the N·k "
                             "choices, so the f_e sum to 1"),
                         (N, "P_e is the mean probability over the tokens, not the sum")):
        # float32 rounding still gets its hint
        if factor != 1 and math.isclose(value, want * factor, rel_tol=1e-6):
            return hint
    if math.isclose(value, _loss_of(torch.softmax(logits, dim=0), k), rel_tol=1e-6):
        return "that softmax is over the tokens (dim 0): it is over each token's E experts"
    return AUX_HINT


def _loss_of(probs, k):
    """E · Σ f_e · P_e of given (N, E) probabilities: a softmax over the wrong dim's loss."""
    N, E = probs.shape
    f = torch.bincount(probs.topk(k, dim=1).indices.flatten(), minlength=E).double() / (N * k)
    return float(E * (f * probs.mean(dim=0)).sum())
