"""Lesson 08, exercise 5: the bytes one rank sends for one attention layer.

    check_cp_bytes_per_layer(cp_bytes_per_layer)

cp_bytes_per_layer(method, cp, batch, seq_len, hidden, itemsize) -> {"forward": bytes,
"backward": bytes}: what one rank of a context-parallel group sends over its link for one
attention layer of the course GPT (K and V as wide as the hidden size), method "ring", "zigzag",
"ulysses" or "allgather". The reference is the lesson's own count of the messages,
`dlcourse.parallel.context.measure.layer_formula` (which tests/test_context_parallel.py proves
equal to the messages counted on real ranks), turned into bytes sent: a send whole, a receive
not at all (it is the other end of a send), an all-to-all, all-gather or reduce-scatter
(cp - 1)/cp of its size (a ring's bus factor, `collectives.cost.bus_factor`, exact here in
fractions). It is computed after the student's function returned; while it runs the lesson's
package and this module are refused (`answers.py`). Cases are drawn per run: every method,
2 to 8 ranks (each method at least once not 4), batch, sequence and hidden size drawn.
"""

import math
import numbers
from fractions import Fraction
from types import SimpleNamespace

import torch

from dlcourse.checks.context.answers import ANSWERS
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.parallel.context.measure import layer_formula

METHODS = ("ring", "zigzag", "ulysses", "allgather")
BYTES_HINT = ("count what this rank sends, pass by pass: the ring sends its K/V block on cp - 1 "
              "times per pass, Ulysses' all-to-all keeps 1/cp of each tensor and sends the rest, "
              "all-gather's ring forwards cp - 1 shards; then times itemsize")
# The share of an op's size that one rank sends (on a ring for the collectives): a receive is
# another rank's send, counted there.
SENT_SHARE = {"send": lambda cp: Fraction(1), "recv": lambda cp: Fraction(0),
              "all_to_all": lambda cp: Fraction(cp - 1, cp),
              "all_gather": lambda cp: Fraction(cp - 1, cp),
              "reduce_scatter": lambda cp: Fraction(cp - 1, cp)}
# A float answer ((cp-1)/cp computed in floats) rounds at ~1e-16 relative per operation; 1e-9
# leaves room for that. The mistakes below are off by 6% or more (cp = 4 for cp = 5: 16/15).
REL_TOL = 1e-9


def reference_bytes(method, cp, batch, seq_len, hidden, itemsize):
    """{"forward"/"backward": Fraction} bytes one rank sends, from the lesson's layer_formula."""
    formula = layer_formula(SimpleNamespace(seq_len=seq_len, hidden=hidden), batch, cp, method)
    return {p: sum((calls * values * itemsize * SENT_SHARE[op](cp)
                    for (op, values), calls in counts.items()), Fraction(0))
            for p, counts in formula.items()}


def _cases(rng):
    """(method, cp, batch, seq_len, hidden, itemsize): each method twice, once with cp not 4.
    seq_len is a multiple of 2·cp (zig-zag's chunks), hidden of cp (Ulysses' heads)."""
    cps = [rng.choice([2, 3, 5, 6, 7, 8]) if first else rng.randint(2, 8)
           for _ in METHODS for first in (True, False)]
    cases = [(method, cp, rng.randint(1, 8), 2 * cp * rng.randint(1, 256),
              cp * rng.randint(2, 64), rng.choice([2, 4]))
             for method, cp in zip([m for m in METHODS for _ in (0, 1)], cps)]
    rng.shuffle(cases)
    return cases


@fresh_cases
def check_cp_bytes_per_layer(cp_bytes_per_layer, *, rng):
    """cp_bytes_per_layer(method, cp, batch, seq_len, hidden, itemsize) -> {"forward": int,
    "backward": int}, the bytes one rank sends, equal to the lesson's formula on every case."""
    __tracebackhide__ = True
    expect_callable(cp_bytes_per_layer, "cp_bytes_per_layer")
    cases = _cases(rng)
    for case in cases:
        where = ("cp_bytes_per_layer(method={!r}, cp={}, batch={}, seq_len={}, hidden={}, "
                 "itemsize={})".format(*case))
        got = call_in_process(cp_bytes_per_layer, case, exercise="cp_bytes_per_layer",
                              where=where, guard=ANSWERS.in_process, hint=BYTES_HINT)
        _expect_bytes(_as_parts(got, where), case, where)
    print(f"cp_bytes_per_layer: passed on {len(cases)} cases drawn at random (every method, "
          f"{', '.join(sorted({str(c[1]) for c in cases}))} ranks). " + _summary())


def _as_parts(got, where):
    """{"forward": number, "backward": number} from a dict or a (forward, backward) pair of
    numbers (a numpy integer arrives as an int, a 0-dim tensor is read as its number)."""
    __tracebackhide__ = True
    if isinstance(got, dict):
        if set(got) != {"forward", "backward"}:
            fail(where, None, f"returned a dict with keys {sorted(map(str, got))}, expected "
                              "exactly 'forward' and 'backward'", BYTES_HINT)
        parts = dict(got)
    elif isinstance(got, (tuple, list)) and len(got) == 2:
        parts = dict(zip(("forward", "backward"), got))
    else:
        fail(where, None, f"returned {kind(got)}, expected {{'forward': bytes, 'backward': "
                          "bytes}", BYTES_HINT)
    for name, value in parts.items():
        if isinstance(value, torch.Tensor) and value.dim() == 0:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value):
            fail(where, None, f"returned {kind(value)} as {name}, expected a number of bytes",
                 BYTES_HINT)
        parts[name] = value
    return parts


def _close(got, want):
    return math.isclose(got, want, rel_tol=REL_TOL)


def _expect_bytes(got, case, where):
    __tracebackhide__ = True
    want = reference_bytes(*case)
    wrong = [p for p in ("forward", "backward") if not _close(got[p], want[p])]
    if not wrong:
        return
    problem = "; ".join(f"{p} is {_number(got[p])} bytes, expected {_number(want[p])}"
                        for p in wrong)
    fail(where, None, problem, _explain(got, want, wrong, case))


def _explain(got, want, wrong, case):
    """The hint of the first known mistake that gives what came back, forward and backward."""
    for mistake, hint in _mistakes(case, want):  # loosely: a mistake written with // (or cp = 4
        # where s or h is no multiple of 4) is a few bytes off; right and wrong differ by >= 6%
        if all(math.isclose(got[p], mistake[p], rel_tol=1e-3, abs_tol=1) for p in mistake):
            return hint
    return BYTES_HINT


def _mistakes(case, want):
    """[(what a mistaken answer returns, the hint for it)] for this case."""
    method, cp, b, s, h, e = case
    bsh = b * s * h
    both = lambda x: {"forward": x, "backward": x}  # noqa: E731
    found = [({p: want[p] / e for p in want}, "these are values, not bytes: times itemsize"),
             ({"forward": want["backward"], "backward": want["forward"]},
              "forward and backward are swapped")]
    if cp != 4:
        found.append((reference_bytes(method, 4, b, s, h, e),
                      f"that is the answer for cp = 4, not for cp = {cp}: write it in cp"))
    if method in ("ring", "zigzag"):
        kv = Fraction(2 * bsh * e, cp)  # one message: this rank's K and V
        found += [
            ({"forward": cp * kv, "backward": 2 * cp * kv},
             "a rank's own block never travels: in cp steps it sends cp - 1 blocks, not cp"),
            ({"forward": want["forward"], "backward": want["forward"]},
             "backward is two passes around the ring, not one: K and V go around again (a "
             "rank saved only its own block) and dK, dV travel on to their home ranks"),
            ({"forward": 2 * want["forward"], "backward": 2 * want["backward"]},
             "count what this rank sends; what it receives is its neighbour's send"),
            ({p: want[p] / 2 for p in want},
             "a message carries K and V: 2·b·(s/cp)·h values, not one of them")]
    elif method == "ulysses":
        found += [
            (both(4 * Fraction(bsh * e, cp)),
             "an all-to-all keeps 1/cp of each rank's tensor where it is and sends the other "
             "(cp - 1)/cp, which is what a rank's link carries"),
            (both(4 * Fraction(cp - 1, cp) * bsh * e),
             "a rank's tensor holds its s/cp tokens, b·(s/cp)·h values, not the whole sequence"),
            (both(3 * Fraction(cp - 1, cp) * Fraction(bsh * e, cp)),
             "four all-to-alls each way: q, k and v to heads, and the output back to tokens")]
    else:
        found += [
            (both(2 * bsh * e), "the all-gather gives every rank 2·b·s·h values, but a rank "
                                "already holds its own 1/cp: it sends (cp - 1)/cp of that"),
            (both(Fraction(2 * bsh * e, cp)), "on a ring a rank forwards cp - 1 shards of K and "
                                              "V (its own and the others'), not one")]
    return found


def _number(x):
    return f"{int(x):,}" if x == int(x) else f"{float(x):,.2f}"


def _summary():
    """How the three volumes scale with cp, on one long sequence (b = 1, s = 8192, h = 4096,
    bf16): the ring's and all-gather's bytes per rank grow towards a limit, Ulysses' shrink."""
    lines = []
    for method in ("ring", "ulysses", "allgather"):
        mib = [float(sum(reference_bytes(method, cp, 1, 8192, 4096, 2).values())) / 2**20
               for cp in (2, 8)]
        lines.append(f"{method} {mib[0]:,.0f} MiB at cp = 2, {mib[1]:,.0f} MiB at cp = 8")
    return ("One layer forward and backward, b = 1, s = 8192, h = 4096, bf16, per rank: "
            + "; ".join(lines) + ": Ulysses' bytes shrink as cp grows, the others' do not")
