"""Check for lesson 09's all-to-all bytes exercise (`exercises/09_experts.ipynb`), a formula
called here:

    check_a2a_bytes_per_layer(a2a_bytes_per_layer)   bytes one rank sends in an MoE layer's
                                                     all-to-alls, forward and backward

The reference is the lesson's `all_to_all_formula` (`dlcourse/parallel/expert/measure.py`), the
bytes that leave a rank in ONE all-to-all under uniform routing, which lesson 09 and
`tests/test_expert_parallel.py` prove equal to `CommCounter`'s count of a real EP layer. A pass
has two of them (dispatch and combine), so each of "forward" and "backward" is twice the formula.
It is called after the student's function has returned (while it runs, it is refused).

Cases are drawn afresh on each run: ep from 2 to 8 with 2 and a non-power of two always among
them, k = 1, 2 and 3, tokens a multiple of ep (so uniform routing exists), hidden sizes and item
sizes (1, 2, 4, 8 bytes) drawn. Any plain number passes (int, numpy, Fraction, float), compared
with a relative tolerance of 1e-9: a float answer computed in another order is off by a few
float64 roundings (about 1e-16 each), while each wrong answer in `MISTAKES` is 1/16 off or more
(the closest: an answer right for ep = 4 only, at ep = 5, 15/16 of the bytes).
"""

import math
import numbers
from types import SimpleNamespace

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.expert.answers import ANSWERS
from dlcourse.parallel.expert.measure import all_to_all_formula

BYTES_HINT = ("per pass, count each all-to-all that moves activation rows: how many rows this "
              "rank sends, how many of them leave it, and how many bytes a row is")
PASSES = ("forward", "backward")
REL_TOL = 1e-9  # float64 rounding of a few products (~1e-16 each); MISTAKES are >= 1/16 off


@fresh_cases
def check_a2a_bytes_per_layer(a2a_bytes_per_layer, *, rng):
    """a2a_bytes_per_layer(tokens, hidden, top_k, ep, itemsize) -> {"forward": bytes,
    "backward": bytes} this rank sends in one MoE layer's all-to-alls of rows, routing uniform."""
    __tracebackhide__ = True
    expect_callable(a2a_bytes_per_layer, "a2a_bytes_per_layer")
    eps = [2, rng.choice([3, 5, 6, 7]), 8] + [rng.randint(2, 8) for _ in range(3)]
    ks = [1, 2, 3] + [rng.randint(1, 3) for _ in range(3)]
    rng.shuffle(eps)
    rng.shuffle(ks)
    cases = [(ep * rng.randint(1, 256), rng.randint(8, 8192), k, ep, rng.choice([1, 2, 4, 8]))
             for ep, k in zip(eps, ks)]
    cases[0] = cases[0][:4] + (rng.choice([2, 4]),)  # an item size above 1 in one case at least
    answers = []
    for case in cases:
        where = _where(case)
        got = call_in_process(a2a_bytes_per_layer, case, exercise="a2a_bytes_per_layer",
                              where=where, guard=ANSWERS.in_process, hint=BYTES_HINT)
        _expect_dict(got, where)
        answers.append(got)
    for case, got in zip(cases, answers):  # every case answered first: a hint must fit them all
        want = expected_bytes(*case)
        for p in PASSES:
            if not math.isclose(float(got[p]), want, rel_tol=REL_TOL):
                fail(_where(case), None, f"returned {p} = {got[p]} bytes, expected {want:.0f}",
                     _hint(p, cases, answers))
    print(f"a2a_bytes_per_layer: passed on {len(cases)} cases drawn at random (ep = "
          f"{', '.join(str(c[3]) for c in cases)}; k from 1 to 3): forward and backward bytes "
          "equal to twice the lesson's all_to_all_formula")


def expected_bytes(tokens, hidden, top_k, ep, itemsize):
    """Twice the lesson's formula for one all-to-all: dispatch and combine, in each pass. The
    formula reads a config's top_k, seq_len and hidden; `tokens` are one sequence of them."""
    config = SimpleNamespace(top_k=top_k, seq_len=tokens, hidden=hidden)
    return 2 * all_to_all_formula(config, 1, ep, itemsize)


def _where(case):
    tokens, h, k, ep, itemsize = case
    return (f"a2a_bytes_per_layer(tokens={tokens}, hidden={h}, top_k={k}, ep={ep}, "
            f"itemsize={itemsize})")


def _number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _expect_dict(got, where):
    __tracebackhide__ = True
    if (not isinstance(got, dict) or set(got) != set(PASSES)
            or not all(_number(got[p]) for p in PASSES)):
        fail(where, None, f"returned {kind(got)}"
             + (f" with keys {sorted(map(str, got))}" if isinstance(got, dict) else "")
             + ', expected a dict {"forward": bytes, "backward": bytes}, each a number',
             BYTES_HINT)


# The usual mistakes, each as the factor it puts on the right answer for (tokens, h, k, ep,
# itemsize). One case can fit two of them (k = itemsize = 2 fits three); the cases together
# tell them apart, so a hint is given when a mistake fits the answers to every case.
MISTAKES = (
    (lambda t, h, k, ep, i: ep / (ep - 1),
     "not every row leaves the rank: with uniform routing 1/ep of them go to its own experts "
     "and never cross its link"),
    (lambda t, h, k, ep, i: 1 / k, "a token goes to top_k experts: it is sent as top_k rows, "
     "not one"),
    (lambda t, h, k, ep, i: 1 / 2, "a pass has two all-to-alls of rows: the dispatch takes "
     "them to their experts, the combine brings the experts' outputs back"),
    (lambda t, h, k, ep, i: 2, "forward and backward separately: each pass has its own "
     "dispatch and combine"),
    (lambda t, h, k, ep, i: 1 / i, "bytes, not values: a row of hidden values is "
     "hidden · itemsize bytes"),
    (lambda t, h, k, ep, i: 3 / 4 * ep / (ep - 1), "right for ep = 4 only? The share of rows "
     "that leaves a rank depends on ep"),
)


def _hint(p, cases, answers):
    """The mistake that explains the answers to every case, else BYTES_HINT."""
    for factor, hint in MISTAKES:
        if all(math.isclose(float(got[p]), expected_bytes(*c) * factor(*c), rel_tol=REL_TOL)
               for c, got in zip(cases, answers)):
            return hint
    return BYTES_HINT
