"""Lesson 08, exercise 4: Ulysses' all-to-all, from sequence-sharded to head-sharded.

    check_seq_to_heads(seq_to_heads)

seq_to_heads(x, group) -> (b, a/cp, s, d): rank r holds x (b, a, s/cp, d), the r-th s/cp tokens
of every head, and returns all s tokens, in order, of its a/cp heads r·a/cp to (r+1)·a/cp - 1
(DeepSpeed-Ulysses, Jacobs et al. 2023, Section 3). Run on 2 to 5 real ranks per case (drawn per
run, never 4 alone; heads a multiple of cp), each rank sent only its own tokens; the result must
equal the slice of the whole tensor, put together here. Only all-to-all and send/recv are
allowed, and a rank may send no more than an all-to-all does, (cp - 1)/cp of its x: an
all-gather built from send/recv fails on its bytes; nor receive less, counted by the kernel on
its connections (`run_on_ranks(receives=)`): data moved another way fails; nor more than that
and a few messages' headers (`expect_received_at_most`): every rank's whole x sent to each,
with a counter faked to say otherwise, fails. One case moves `WIRE_FLOOR` (2 KiB) or more from
each rank to each other, so that these counts stand clear of gloo's headers (a token message's
~144 B a peer exceed a small case's few bytes). A misplaced value is named by where it came
from (head and position in the whole tensor).
"""

import torch

from dlcourse.checks.context.reference import normal, world_sizes
from dlcourse.checks.context.answers import ANSWERS
from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, describe, expect_callable, fail,
                                  fresh_cases, run_on_ranks)
from dlcourse.checks.core.ranks import HEADER_ROOM, WIRE_FLOOR, expect_received_at_most
from dlcourse.checks.context.in_rank import seq_to_heads_in_rank

ALLOWED = ("all_to_all", "all_to_all_single")
WHY_ALL_TO_ALL = ("the re-layout is one all-to-all: each rank sends every other rank the heads "
                  "it will hold and receives its own heads' tokens from each (dist.all_to_all, "
                  "all_to_all_single, or send/recv)")
ULYSSES_HINT = ("split x's heads into cp groups of a/cp; send group j to rank j with one "
                "all-to-all; what comes back from rank i is tokens i·s/cp to (i+1)·s/cp - 1 of "
                "your heads: concatenate along the sequence dimension in rank order")


@fresh_cases
def check_seq_to_heads(seq_to_heads, timeout=CHECK_TIMEOUT_S, *, rng):
    """seq_to_heads(x, group) on cp ranks -> each rank's heads, every token, in order."""
    __tracebackhide__ = True
    expect_callable(seq_to_heads, "seq_to_heads")
    sizes = world_sizes(rng, 3, 2, 5)
    # (heads per rank, tokens per rank): one case with 2 or more of each, where a head order
    # or a token order that is wrong shows (with one of each every order is right)
    shapes = [(rng.randint(2, 3), rng.randint(2, 3))] + [
        (rng.randint(1, 3), rng.randint(1, 3)) for _ in sizes[1:]]
    rng.shuffle(shapes)
    wide = rng.randrange(len(sizes))  # the case whose messages stand clear of gloo's headers
    for i, (cp, (h, n)) in enumerate(zip(sizes, shapes)):
        _check_case(seq_to_heads, rng, cp, h, n, timeout, wide=i == wide)
    print(f"seq_to_heads: passed on {len(sizes)} cases drawn at random "
          f"({', '.join(map(str, sizes))} ranks): every rank holds its a/cp heads over the whole "
          "sequence, moved by all-to-all, (cp - 1)/cp of its tokens sent and received (in one "
          f"case {WIRE_FLOOR} bytes or more from each rank to each other)")


def _check_case(seq_to_heads, rng, cp, h, n, timeout, wide=False):
    __tracebackhide__ = True
    b, d, a = rng.randint(1, 2), rng.randint(1, 4), cp * h
    dtype = rng.choice([torch.float32, torch.float64])
    if wide:  # rank r sends rank j its b·h·n·d values of j's heads: WIRE_FLOOR bytes or more
        d = max(d, -(-WIRE_FLOOR // (b * h * n * dtype.itemsize)))
    whole = normal((b, a, n * cp, d), rng, dtype)  # (b, a, s, d): random, no two values alike
    shards = list(whole.split(n, dim=2))  # rank r: tokens r·n .. (r+1)·n - 1 of every head
    where = (f"seq_to_heads on {cp} ranks, {a} heads, {n * cp} tokens, x: "
             f"{describe(shards[0])}")
    must = (cp - 1) * shards[0].numel() * shards[0].element_size() // cp  # others' tokens
    received = {}  # {rank: bytes}, counted by the kernel
    outcomes = run_on_ranks(seq_to_heads, [(x,) for x in shards], exercise="seq_to_heads",
                            where=where, hint=ULYSSES_HINT,
                            forbid=tuple(c for c in COLLECTIVES if c not in ALLOWED),
                            why_forbidden=WHY_ALL_TO_ALL, harness=seq_to_heads_in_rank,
                            guard=ANSWERS.in_rank, timeout=timeout, receives=[must] * cp,
                            received=received)
    for r, ((got, leaving), after) in enumerate(outcomes):
        if not torch.equal(after[0], shards[r]):
            fail(where, r, "changed x in place: the caller's tensor must keep its values",
                 "send from x, receive into new buffers")
        expected = whole[:, r * h:(r + 1) * h]  # (b, a/cp, s, d)
        _expect_heads(got, expected, whole, r, h, where)
        allowed = (cp - 1) * shards[r].numel() * shards[r].element_size() // cp
        if leaving > allowed:
            fail(where, r, f"sent {leaving} bytes to other ranks, where one all-to-all sends "
                           f"(cp - 1)/cp of x: {allowed} bytes",
                 "send each rank only the heads it will hold, not the whole x")
    expect_received_at_most(received, [must + HEADER_ROOM * (cp - 1)] * cp, where,
                            "send each rank only the heads it will hold, not the whole x")


def _expect_heads(got, expected, whole, r, h, where):
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        got = _as_tensor(got, expected.dtype, where, r)
    if got.shape != expected.shape:
        fail(where, r, f"returned {describe(got)}, expected shape {tuple(expected.shape)} "
                       f"(b, a/cp = {h} heads, s = {expected.size(2)} tokens, d)", ULYSSES_HINT)
    if got.dtype != expected.dtype:
        fail(where, r, f"returned {describe(got)}, expected x's dtype, "
                       f"{str(expected.dtype).removeprefix('torch.')}", ULYSSES_HINT)
    if torch.equal(got, expected):
        return
    # every (head, token) slot of the answer, named by where its values came from
    b, a, s, d = whole.shape
    for head in range(h):
        for pos in range(s):
            if torch.equal(got[:, head, pos], expected[:, head, pos]):
                continue
            source = _source(got[:, head, pos], whole)
            came = (f"head {source[0]}, token {source[1]} of the whole x" if source
                    else "values that are in no slot of the whole x")
            fail(where, r, f"holds at head {head}, token {pos} {came}; expected head "
                           f"{r * h + head}, token {pos}", _hint(source, r, h, head, pos, s))


def _source(values, whole):
    """(head, token) of the whole tensor whose (b, d) values these are, or None."""
    for head in range(whole.size(1)):
        for pos in range(whole.size(2)):
            if torch.equal(values, whole[:, head, pos]):
                return head, pos
    return None


def _hint(source, r, h, head, pos, s):
    if source is None:
        return ULYSSES_HINT
    if source[1] == pos and source[0] != r * h + head:
        return (f"the right token, the wrong head: rank {r} holds heads {r * h} to "
                f"{(r + 1) * h - 1}, consecutive, the r-th group of a/cp")
    if source[0] == r * h + head:
        return ("the right head, the tokens out of order: the s/cp tokens received from rank i "
                "are positions i·s/cp to (i+1)·s/cp - 1 of the result, in rank order")
    return ULYSSES_HINT


def _as_tensor(got, dtype, where, r):
    """A numpy array comes as nested lists (`returned.as_data`): fine, read in x's dtype."""
    __tracebackhide__ = True
    try:
        return torch.as_tensor(got, dtype=dtype)
    except (TypeError, ValueError, RuntimeError):
        fail(where, r, f"returned a {type(got).__name__}, expected a tensor", ULYSSES_HINT)
