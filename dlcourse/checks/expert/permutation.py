"""Check for lesson 09's permutation exercise (`exercises/09_experts.ipynb`), formulas called here:

    check_permutation(permute_by_destination, unpermute)
        permute_by_destination(experts (N, k), n_experts) -> order (N·k,): the flat assignments
            grouped by expert (so by destination rank), each expert's in (token, choice) order
        unpermute(y (N·k, h), order, weights (N, k)) -> (N, h): row i of y is the output for
            assignment order[i]; each token gets its k outputs back, mixed by its router weights

Cases are drawn afresh on each run: few experts (3 to 7) for up to 48 assignments, so that every
expert has several and an unstable sort reorders them; an expert no token chooses in every case
but the first, below the last expert (counts or offsets that skip it misplace the experts above);
a permutation that is never its own inverse (so applying it again is not undoing it); k from 1
to 3 with weights that are not all equal. `unpermute` is given the reference's order, so each
function is judged on its own. The references (`reference.py`) run after the student's function
returned. Refused while it runs: the lesson's `permute`, `combine`, `sort_by_local_expert`,
`inverse_permutation` and the rest of `ANSWERS` (`answers.py`). torch 2.13 has no function that
does an MoE permutation for the student (its only one, symmetric memory's `all_to_all_vdev_2d`,
is a CUDA NVSHMEM dispatch): `argsort(stable=True)`, `sort`, scatter, `index_add` are the tools
the exercise expects, and allowed.
"""

import torch

from dlcourse.checks.core import (as_tensor, call_in_process, expect_callable, fail, fresh_cases,
                                  kind)
from dlcourse.checks.expert.reference import by_destination, unpermuted
from dlcourse.checks.expert.answers import ANSWERS

PERMUTE_HINT = ("flatten the (N, k) experts (assignment n·k + j is token n's j-th choice) and "
                "argsort them with stable=True: each expert's assignments keep their order")
UNPERMUTE_HINT = ("row i of y belongs to assignment order[i] (token order[i] // k): put the rows "
                  "back where they came from, then each token's k rows times their weights, "
                  "summed")
# float64: a sum of at most 3 products; rtol 1e-12 leaves room for another order of the sum
RTOL, ATOL = 1e-12, 1e-13


def _draw_case(rng, i):
    """experts (N, k) int64 with distinct experts per token (as top-k gives), n_experts, the
    idle experts below the last one used: none in case 0, where every expert gets assignments;
    drawn again until the order tells the wrong answers apart."""
    k = 1 if i == 0 else 2 if i == 1 else rng.randint(1, 3)
    E = rng.randint(max(3, k + 2), 7)
    N = rng.randint(8, 16)
    idle = [] if i == 0 else [rng.randrange(E - 1)]  # never the last: experts above it are used
    used = [e for e in range(E) if e not in idle]
    for _ in range(100):  # nearly every draw passes at once
        rows = [rng.sample(used, k) for _ in range(N - (E if i == 0 else 0))]
        rows += [[e] for e in range(E)] if i == 0 else []  # case 0 (k = 1): every expert used
        rng.shuffle(rows)
        experts = torch.tensor(rows, dtype=torch.int64)
        order = by_destination(experts, E)
        chosen = set(experts.flatten().tolist())
        idle = [e for e in range(max(chosen)) if e not in chosen]
        if not torch.equal(order[order], torch.arange(N * k)) and (idle or i == 0):
            break
    return experts, E, idle


def _draw_weights(rng, n_tokens, k):
    gen = torch.Generator().manual_seed(rng.randrange(2**62))
    w = torch.rand(n_tokens, k, generator=gen, dtype=torch.float64) + 0.1
    return (w / w.sum(dim=1, keepdim=True)).sort(dim=1, descending=True).values  # as top-k


@fresh_cases
def check_permutation(permute_by_destination, unpermute, *, rng):
    """Both functions on 5 cases, against `reference.by_destination` and `reference.unpermuted`."""
    __tracebackhide__ = True
    expect_callable(permute_by_destination, "permute_by_destination")
    expect_callable(unpermute, "unpermute")
    cases = [_draw_case(rng, i) for i in range(5)]
    for experts, E, idle in cases:
        _check_permute(permute_by_destination, experts, E, idle)
    for experts, E, _ in cases:
        N, k = experts.shape
        gen = torch.Generator().manual_seed(rng.randrange(2**62))
        y = torch.randn(N * k, rng.randint(3, 8), generator=gen, dtype=torch.float64)
        _check_unpermute(unpermute, y, by_destination(experts, E), _draw_weights(rng, N, k))
    print(f"permutation: passed on {len(cases)} cases drawn at random (E from "
          f"{min(c[1] for c in cases)} to {max(c[1] for c in cases)}, k = "
          + ", ".join(str(c[0].size(1)) for c in cases) + f"; {len(cases) - 1} with an idle "
          "expert): the stable permutation by destination, and its inverse with each token's k "
          "outputs mixed by weight")


def _check_permute(permute_by_destination, experts, E, idle):
    __tracebackhide__ = True
    N, k = experts.shape
    where = (f"permute_by_destination(experts ({N}, {k}) int64, n_experts={E}"
             + (f"; expert {idle[0]} chosen by no token)" if idle else ")"))
    got = call_in_process(permute_by_destination, (experts.clone(), E),
                          exercise="permute_by_destination", where=where,
                          guard=ANSWERS.in_process, hint=_idle_hint(idle) or PERMUTE_HINT)
    order, want = as_tensor(got), by_destination(experts, E)
    if order is None or order.shape != want.shape or order.is_floating_point() \
            or order.dtype == torch.bool:
        fail(where, None, f"returned {kind(got) if order is None else kind(order)}, expected "
                          f"{N * k} whole numbers: the index of every assignment, once",
             PERMUTE_HINT)
    order = order.to(torch.int64)
    if not torch.equal(order.sort().values, torch.arange(N * k)):
        fail(where, None, f"returned {order.tolist()}, which is not a permutation of 0 .. "
                          f"{N * k - 1}: every assignment (token n's j-th choice is n·k + j) "
                          "must appear exactly once", _idle_hint(idle) or PERMUTE_HINT)
    if not torch.equal(order, want):
        first = int((order != want).nonzero()[0])
        fail(where, None, f"place {first} holds assignment {int(order[first])} (expert "
                          f"{int(experts.flatten()[order[first]])}), expected assignment "
                          f"{int(want[first])} (expert {int(experts.flatten()[want[first]])}); "
                          f"{int((order != want).sum())} of {N * k} places differ",
             _permute_hint(order, want, experts.flatten(), idle))


def _idle_hint(idle):
    if not idle:
        return ""
    return (f"expert {idle[0]} gets nothing here, yet experts above it do: counts per expert "
            "need a 0 for it (torch.bincount(..., minlength=n_experts), not torch.unique)")


def _permute_hint(order, want, flat, idle):
    grouped = flat[order]
    if torch.equal(grouped, flat[want]):
        return ("grouped by expert, but an expert's assignments are reordered: the sort must be "
                "stable (torch.argsort(..., stable=True)), so each expert sees them in token order")
    if torch.equal(grouped, flat[want].flip(0)):
        return "that is by expert descending: expert 0's assignments come first"
    return _idle_hint(idle) or PERMUTE_HINT


def _check_unpermute(unpermute, y, order, weights):
    __tracebackhide__ = True
    (N, k), h = weights.shape, y.size(1)
    where = f"unpermute(y ({N * k}, {h}) float64, order ({N * k},), weights ({N}, {k}) float64)"
    got = call_in_process(unpermute, (y.clone(), order.clone(), weights.clone()),
                          exercise="unpermute", where=where, guard=ANSWERS.in_process,
                          hint=UNPERMUTE_HINT)
    out = got.detach() if isinstance(got, torch.Tensor) else as_tensor(got, torch.float64)
    want = unpermuted(y, order, weights)
    if out is None or out.shape != want.shape:
        what = "nothing tensor-like" if out is None else f"shape {tuple(out.shape)}"
        hint = (f"one row per token: add each token's k = {k} rows into one" if out is not None
                and out.shape == y.shape and k > 1 else UNPERMUTE_HINT)
        fail(where, None, f"returned {what}, expected ({N}, {h}): one row per token", hint)
    out = out.to(torch.float64)
    if not torch.allclose(out, want, rtol=RTOL, atol=ATOL):
        bad = ~torch.isclose(out, want, rtol=RTOL, atol=ATOL).all(dim=1)
        n = int(bad.nonzero()[0])
        fail(where, None, f"token {n}'s row is {_short(out[n])}, expected {_short(want[n])} "
                          f"({int(bad.sum())} of {N} tokens differ; float64 rounding allows a "
                          f"relative {RTOL:g})", _unpermute_hint(out, y, order, weights, want))


def _short(row):
    return "[" + ", ".join(f"{v:.6g}" for v in row[:4].tolist()) + (", ...]" if row.numel() > 4
                                                                    else "]")


def _unpermute_hint(out, y, order, weights, want):
    """Which mistake gives `out`: the permutation applied again, weights left out, float32."""
    N, k = weights.shape
    if torch.allclose(out, want, rtol=1e-5, atol=1e-6):
        return "within float32 rounding of it: keep y's dtype, float64"
    ones = torch.ones_like(weights)
    close = lambda a: torch.allclose(out, a, rtol=1e-6, atol=1e-8)  # noqa: E731
    if close(unpermuted(y[order], torch.arange(N * k), weights)):  # gathered, not scattered
        return ("that applies the permutation again (y[order]): row i of y is the output for "
                "assignment order[i], so it goes back to place order[i] (out[order] = y), the "
                "inverse permutation")
    if k > 1 and (close(unpermuted(y, order, ones)) or close(unpermuted(y, order, ones / k))):
        return ("each token's k outputs are added without their router weights: multiply "
                "assignment (n, j)'s output by weights[n, j], then sum over j")
    first = weights.clone().zero_()
    first[:, 0] = 1
    if k > 1 and any(close(unpermuted(y, order, w)) for w in (first, weights * first)):
        return (f"only each token's first choice came back: a token appears k = {k} times in y, "
                "and all k of its outputs are mixed")
    return UNPERMUTE_HINT
