"""Lesson 09, exercise 2 (`exercises/09_experts.ipynb`): `check_load_balance_loss`, Switch's
E · Σ f_e · P_e, its value and its gradient w.r.t. the logits (through P only), against
`reference.switch_loss`, computed after the student's function has returned.
"""

import math

import torch

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases
from dlcourse.checks.expert.answers import ANSWERS
from dlcourse.checks.expert.cases import RTOL, draw_logits
from dlcourse.checks.expert.in_rank import loss_and_grad
from dlcourse.checks.expert.reference import switch_loss


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
