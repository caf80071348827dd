"""Check for lesson 09's counting exercise (`exercises/09_experts.ipynb`), a formula called here:

    check_moe_layer_counts(moe_layer_counts)   total and active parameters, forward FLOPs/token

Sizes are drawn afresh on each run (widths, experts, k from 1 to E, with and without biases);
the reference (`reference.layer_counts`) builds the layer from torch.nn on the meta device and
counts it, after the student's function has returned. Any plain whole number passes (an int, a
numpy integer, a Fraction or float with a whole value), in a tuple or a list.
"""

import numbers

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.expert.reference import layer_counts
from dlcourse.checks.expert.answers import ANSWERS

COUNT_HINT = ("a router Linear(h, E) without bias; each expert Linear(h, f) and Linear(f, h), "
              "with biases f and h when bias; total: the router and E experts, active: the "
              "router and the k experts a token goes to; FLOPs: 2 per weight of those matrices")
NAMES = ("total", "active", "forward FLOPs per token")


@fresh_cases
def check_moe_layer_counts(moe_layer_counts, *, rng):
    """moe_layer_counts(hidden, expert_hidden, n_experts, top_k, bias) -> (total parameters,
    active parameters, forward FLOPs per token)."""
    __tracebackhide__ = True
    expect_callable(moe_layer_counts, "moe_layer_counts")
    cases = []
    for i in range(6):
        E = rng.randint(2, 64)
        k = [1, E][i] if i < 2 else rng.randint(1, min(E, 8))
        cases.append((rng.randint(8, 4096), rng.randint(8, 16384), E, k, i % 2 == 0))
    for case in cases:
        h, f, E, k, bias = case
        where = (f"moe_layer_counts(hidden={h}, expert_hidden={f}, n_experts={E}, top_k={k}, "
                 f"bias={bias})")
        got = call_in_process(moe_layer_counts, case, exercise="moe_layer_counts", where=where,
                              guard=ANSWERS.in_process, hint=COUNT_HINT)
        _expect_counts(got, case, where)
    print(f"moe_layer_counts: passed on {len(cases)} cases drawn at random (E from "
          f"{min(c[2] for c in cases)} to {max(c[2] for c in cases)}, k from 1 to E, with and "
          "without biases): total and active parameters, forward FLOPs per token")


def _whole(value):
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and float(value).is_integer())


def _expect_counts(got, case, where):
    __tracebackhide__ = True
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(map(_whole, got)):
        fail(where, None, f"returned {kind(got)}"
             + (f" {list(got)}" if isinstance(got, (tuple, list)) else "")
             + ", expected three whole numbers (total, active, forward FLOPs per token)",
             COUNT_HINT)
    want = layer_counts(*case)
    for name, g, w in zip(NAMES, got, want):
        if int(g) != w:
            fail(where, None, f"returned {name} = {int(g)}, expected {w}",
                 _hint(name, int(g), case, want))


def _hint(name, got, case, want):
    h, f, E, k, bias = case
    expert = 2 * h * f + ((f + h) if bias else 0)
    if name == "total" and got == want[0] - E * h:
        return "the router is a parameter too: a Linear(h, E) without bias, E·h weights"
    if name == "total" and got == want[1]:
        return "that is what one token uses; the layer holds all E experts"
    if name == "active" and got == want[0]:
        return "a token runs through k of the E experts only, and the router"
    if name == "active" and got == k * expert:
        return "the router runs for every token: count it in active too"
    if name == "forward FLOPs per token":
        if got == 6 * (E * h + 2 * k * h * f):
            return "6 per weight is training (forward and backward); the forward is 2"
        if got == 2 * want[0] or got == 2 * (E * h + 2 * E * h * f):
            return "a token is multiplied by the router and its k experts only, not all E"
        if got == 2 * want[1]:
            return "biases are added, not multiplied: count 2 per weight of the matrices only"
    return COUNT_HINT
