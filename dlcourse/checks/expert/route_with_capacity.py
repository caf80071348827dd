"""Lesson 09, exercise 1 (`exercises/09_experts.ipynb`): `check_route_with_capacity`, top-k with
renormalised weights and each expert's capacity queue, a formula called here; the reference
(`reference.routed`) is computed after the student's function has returned.
"""

import math

import torch

from dlcourse.checks.core import (as_tensor, call_in_process, expect_callable, fail, fresh_cases,
                                  kind)
from dlcourse.checks.expert.answers import ANSWERS
from dlcourse.checks.expert.cases import RTOL, draw_logits
from dlcourse.checks.expert.reference import routed


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
