"""Lesson 08, exercise 2: the zig-zag layout, which balances the causal mask's work.

    check_zigzag_positions(zigzag_positions)

zigzag_positions(rank, cp, seq_len) -> the global positions of the tokens rank `rank` holds, in
its local order: the sequence cut into 2·cp equal chunks, rank r holding chunk r and then chunk
2·cp - 1 - r (torch's `_HeadTailLoadBalancer`, Megatron's layout). Called here for every rank of
cases drawn per run (2 to 8 ranks, never 4 alone, chunks of 1 to 3 tokens) against the layout
built from its definition (`reference.zigzag`); the message of a wrong layout names the chunks it
holds, and a passing run prints the causal work per rank beside the contiguous layout's.
"""

import numbers

import torch

from dlcourse.checks.context.reference import causal_pairs, contiguous, world_sizes, zigzag
from dlcourse.checks.context.answers import ANSWERS
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind

ZIGZAG_HINT = ("cut the sequence into 2·cp chunks of seq_len // (2·cp) tokens; rank r holds "
               "chunk r, then chunk 2·cp - 1 - r, and returns their positions in that order")


@fresh_cases
def check_zigzag_positions(zigzag_positions, *, rng):
    """zigzag_positions(rank, cp, seq_len) -> the positions rank `rank` holds, as zig-zag
    places them, on every rank of each case."""
    __tracebackhide__ = True
    expect_callable(zigzag_positions, "zigzag_positions")
    cases = [(cp, 2 * cp * rng.randint(1, 3)) for cp in world_sizes(rng, 4, 2, 8)]
    for cp, s in cases:
        for rank in range(cp):
            where = f"zigzag_positions(rank={rank}, cp={cp}, seq_len={s})"
            got = call_in_process(zigzag_positions, (rank, cp, s), exercise="zigzag_positions",
                                  where=where, guard=ANSWERS.in_process, hint=ZIGZAG_HINT)
            _expect_positions(_as_positions(got, where), rank, cp, s, where)
    cp, s = max(cases)
    work = [causal_pairs(contiguous(r, cp, s)) for r in range(cp)]
    print(f"zigzag_positions: passed on {len(cases)} cases drawn at random "
          f"({', '.join(str(c) for c, _ in cases)} ranks, every rank): with cp = {cp} and "
          f"{s} tokens every rank computes {causal_pairs(zigzag(0, cp, s))} query-key pairs "
          f"under the causal mask, where contiguous chunks give {work[0]} on rank 0 to "
          f"{work[-1]} on rank {cp - 1}")


def _as_positions(got, where):
    """A list of whole numbers from a list, tuple, range, tensor or numpy array of them."""
    __tracebackhide__ = True
    if isinstance(got, torch.Tensor) and not got.is_floating_point() and got.dim() == 1:
        return got.tolist()
    if isinstance(got, range):
        got = list(got)
    if isinstance(got, (list, tuple)) and all(
            isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in got):
        return [int(p) for p in got]
    fail(where, None, f"returned {kind(got)}, expected a list (or 1-D tensor) of whole-number "
                      "positions", ZIGZAG_HINT)


def _expect_positions(got, rank, cp, s, where):
    __tracebackhide__ = True
    expected = zigzag(rank, cp, s)
    if got == expected:
        return
    c = s // (2 * cp)
    if len(got) != len(expected):
        fail(where, rank, f"holds {len(got)} positions, expected seq_len / cp = {len(expected)}"
                          f": two chunks of {c}", ZIGZAG_HINT)
    problem = f"holds positions {_short(got)}, zig-zag puts {_short(expected)} there"
    chunks = _chunks(got, c)
    if got == contiguous(rank, cp, s):
        hint = (f"that is the contiguous layout: under the causal mask rank {cp - 1} would "
                f"compute {causal_pairs(contiguous(cp - 1, cp, s))} query-key pairs and rank 0 "
                f"{causal_pairs(contiguous(0, cp, s))}; zig-zag pairs an early chunk with a "
                "late one")
    elif chunks == [2 * cp - 1 - rank, rank]:
        hint = "the right chunks in the wrong order: chunk r first, then chunk 2·cp - 1 - r"
    elif chunks is not None and chunks[0] == rank:
        hint = (f"the second chunk is chunk {chunks[1]}; with 2·cp = {2 * cp} chunks numbered "
                f"0 to {2 * cp - 1}, rank {rank}'s mirror is 2·cp - 1 - r = {2 * cp - 1 - rank}")
    else:
        hint = ZIGZAG_HINT
    fail(where, rank, problem + (f" (chunks {chunks} of {c} tokens)" if chunks else ""), hint)


def _chunks(positions, c):
    """The chunk indices of `positions` if they are whole chunks of c tokens in order, else None."""
    found = []
    for start in range(0, len(positions), c):
        piece = positions[start:start + c]
        if piece[0] % c or piece != list(range(piece[0], piece[0] + c)):
            return None
        found.append(piece[0] // c)
    return found


def _short(positions, n=12):
    return str(positions) if len(positions) <= n else str(positions[:n])[:-1] + ", ...]"
