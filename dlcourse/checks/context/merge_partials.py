"""Lesson 08, exercise 1: merge two partial attention results with their log-sum-exps.

    check_merge_partials(merge_partials)

merge_partials(out_1, lse_1, out_2, lse_2) -> (out, lse): the attention of the same queries over
two disjoint blocks of keys, each computed alone, joined into the attention over both. The cases
(drawn per run) split a random attention problem's keys at a random point; the check computes
each block's part and, independently, the attention over all the keys (`reference.attention`,
plain softmax in float64), and the merge must equal the latter. Among them: a causal split in
which some queries see no key of one block (its lse is -inf there, its out 0), the blocks in
either order, scores of a few thousand in float64 and of ~150 in float32, where exp(lse)
overflows (e^709 is float64's largest, e^88.7 float32's), and float32.
"""

import math

import torch

from dlcourse.checks.context.reference import attention
from dlcourse.checks.context.answers import ANSWERS
from dlcourse.checks.core import call_in_process, describe, expect_callable, fail, fresh_cases

MERGE_HINT = ("the merged lse is log(exp(lse_1) + exp(lse_2)), computed without overflow "
              "(torch.logaddexp, or subtract the larger lse first); each block's out is then "
              "weighted by exp(lse_i - lse), its share of the whole softmax's normaliser")
# float64: both sides round at ~1e-16 relative, the merge in another order than one softmax;
# 1e-10 leaves 10^5 times that. float32 (lse ~ 150 rounds to ~1e-5): 1e-4 leaves 10 times it.
# The mistakes named below move values by O(1) or make them inf/NaN.
TOLERANCE = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-4, 1e-4)}


def _cases(rng):
    """(causal, dtype, score scale, swap the blocks) per case; the first ones fixed."""
    fixed = [(False, torch.float64, 1.0, False), (True, torch.float64, 1.0, rng.random() < 0.5),
             (False, torch.float64, 2000.0, False), (True, torch.float32, 150.0, True)]
    drawn = [(rng.random() < 0.5, rng.choice([torch.float32, torch.float64]),
              rng.choice([1.0, 10.0]), rng.random() < 0.5) for _ in range(2)]
    return fixed + drawn


def _problem(rng, causal, dtype, scale, swap):
    """The partial results the student merges, where they come from, and the case's name."""
    b, a, d = rng.randint(1, 2), rng.randint(1, 3), rng.randint(2, 8)
    s = rng.randint(4, 12)
    t = rng.randint(1, s - 1)  # the keys split at t: block 1 holds 0..t-1, block 2 t..s-1
    case = ((b, a, s, d), rng.randrange(2**62), scale, causal)
    q, k, v, pos = _qkv(*case)
    parts = [attention(q, k[:, :, keys], v[:, :, keys], pos, pos[keys], causal)
             for keys in (slice(0, t), slice(t, s))]  # queries before t see nothing of block 2
    if swap:
        parts.reverse()
    args = tuple(x.to(dtype) for part in parts for x in part)  # out_1, lse_1, out_2, lse_2
    where = (f"merge_partials(out_1, lse_1, out_2, lse_2) of {s} queries over {t} and {s - t} "
             f"keys{' (block 2 first)' if swap else ''}, {'causal' if causal else 'no mask'}, "
             f"out_1: {describe(args[0])}, scores ~{scale:g} x N(0, 1)")
    return args, case, where


def _qkv(shape, seed, scale, causal):
    """q (scores ~ scale x N(0, 1)), k, v and the positions of a case, from its seed."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3))
    return scale * q, k, v, torch.arange(shape[2])


def _whole(shape, seed, scale, causal):
    """The attention over all the keys: one softmax, computed after the student's merge
    returned (nothing of it exists while the student's code runs)."""
    q, k, v, pos = _qkv(shape, seed, scale, causal)
    return attention(q, k, v, pos, pos, causal)


@fresh_cases
def check_merge_partials(merge_partials, *, rng):
    """merge_partials(out_1, lse_1, out_2, lse_2) -> (out, lse) equal to one softmax over both
    blocks' keys."""
    __tracebackhide__ = True
    expect_callable(merge_partials, "merge_partials")
    cases = _cases(rng)
    for causal, dtype, scale, swap in cases:
        args, case, where = _problem(rng, causal, dtype, scale, swap)
        got = call_in_process(merge_partials, args, exercise="merge_partials", where=where,
                              guard=ANSWERS.in_process, hint=MERGE_HINT)
        out, lse = _whole(*case)
        got_out, got_lse = _two_tensors(got, out, lse, where)
        rtol, atol = TOLERANCE[dtype]
        _expect_close(got_lse, lse, "lse", args, where, rtol, atol)
        _expect_close(got_out, out, "out", args, where, rtol, atol)
    print(f"merge_partials: passed on {len(cases)} cases drawn at random (causal and not, "
          "float32 and float64, scores up to thousands, where exp overflows), equal to one "
          "softmax over all the keys")


def _two_tensors(got, out, lse, where):
    """(out, lse) as float64 tensors of the expected shapes; a numpy array comes as nested
    lists (`returned.as_data`), which is fine."""
    __tracebackhide__ = True
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(where, None, f"returned {_kind(got)}, expected a pair (out, lse): out "
                          f"{describe(out)}, lse {describe(lse)}", MERGE_HINT)
    tensors = []
    for name, value, like in (("out", got[0], out), ("lse", got[1], lse)):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            fail(where, None, f"returned {_kind(value)} as {name}, expected numbers shaped "
                              f"{tuple(like.shape)}", MERGE_HINT)
        if value.shape != like.shape:
            fail(where, None, f"returned {name} of shape {tuple(value.shape)}, expected "
                              f"{tuple(like.shape)} (b, heads, queries"
                              f"{', d' if name == 'out' else ''})", MERGE_HINT)
        tensors.append(value)
    return tensors


def _expect_close(got, expected, name, args, where, rtol, atol):
    __tracebackhide__ = True
    ok = torch.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=False)
    ok |= torch.isinf(expected) & (got == expected)  # -inf where no key is seen, in both
    if ok.all():
        return
    at = tuple((~ok).nonzero()[0].tolist())
    row = at[:3]
    lse_1, lse_2 = (float(args[i][row]) for i in (1, 3))
    problem = (f"{name}{list(at)} is {got[at].item():.6g}, one softmax over all the keys gives "
               f"{expected[at].item():.6g} ({int((~ok).sum())} of {ok.numel()} differ; there "
               f"lse_1 = {lse_1:.6g}, lse_2 = {lse_2:.6g})")
    fail(where, None, problem, _explain(got, name, args, row, lse_1, lse_2))


def _explain(got, name, args, row, lse_1, lse_2):
    """The hint for the commonest mistakes, recognised from what came back."""
    out_1, l_1, out_2, l_2 = (a.to(torch.float64) for a in args)
    # |lse| > 80: exp overflows float32 (e^88.7) above it; far below 0 both exps underflow to
    # 0 and log(0) is -inf. A -inf lse (a block whose keys the query cannot see) is not this.
    far = any(math.isfinite(x) and abs(x) > 80 for x in (lse_1, lse_2))
    if not torch.isfinite(got[row]).all() and far:
        return ("exp of a log-sum-exp this large overflows (float64 stops at e^709, float32 "
                "at e^88.7), and of one this negative underflows to 0, whose log is -inf: "
                "subtract the larger of lse_1 and lse_2 before exp, or use torch.logaddexp, "
                "which does")
    if not torch.isfinite(got[row]).all():
        return ("a query that sees no key of a block has lse -inf there: exp(-inf - lse) is "
                "0, but -inf - (-inf) is NaN; merge with torch.logaddexp and weights "
                "exp(lse_i - lse)")
    if name == "out":
        for guess, what in (((out_1 + out_2) / 2, "the average of the two outs"),
                            (out_1 + out_2, "the sum of the two outs")):
            if torch.allclose(got, guess, rtol=1e-6, atol=1e-9):
                return (f"that is {what}: each block's softmax has its own normaliser, so "
                        "weight block i by exp(lse_i - lse) before adding")
    if name == "lse" and torch.allclose(got, torch.maximum(l_1, l_2), rtol=1e-9, atol=1e-12):
        return ("that is the larger lse: the merged lse adds both normalisers, "
                "log(exp(lse_1) + exp(lse_2))")
    return MERGE_HINT


def _kind(value):
    return describe(value) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
