"""Check for lesson 09's dispatch exercise (`exercises/09_experts.ipynb`), on real gloo ranks:

    check_dispatch_to_experts(dispatch_to_experts)   counts exchanged, rows sent by all-to-all

Each rank is sent only its own rows and their experts (`run_on_ranks` hands rank r its arguments
alone); the check draws 2, 3 and 4 ranks in a random order, 2 or 3 experts per rank, uneven
routing with an idle expert in every case and, in one case, a rank whose experts get no row at
all. While the student's code runs the lesson's answers are refused (`answers.py`), and so are
the collectives that are not an all-to-all; `CommCounter` counts the bytes each rank sends, which
must be its own rows once and its counts, no more; and each rank must receive the other ranks'
rows routed to its experts, counted by the kernel on its connections (`run_on_ranks(receives=)`),
and no more than those, its counts and a few messages' headers (`expect_received_at_most`):
every row sent to every rank, with a counter faked to say otherwise, fails. In one case every
rank routes a row to every rank, itself included, each row `WIRE_FLOOR` (2 KiB) bytes or more,
so that these counts stand clear of gloo's headers (~144 B a message a peer: counts alone, or a
token, exceed what a small case's rows weigh). The reference (`reference.dispatched`) is
computed here from every rank's inputs after the ranks have finished.
"""

import torch

from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, expect_callable, fail,
                                  fresh_cases, kind, run_on_ranks)
from dlcourse.checks.core.ranks import HEADER_ROOM, WIRE_FLOOR, expect_received_at_most
from dlcourse.checks.expert.answers import ANSWERS
from dlcourse.checks.expert.in_rank import dispatch_in_rank
from dlcourse.checks.expert.reference import dispatched

WHY_ALL_TO_ALL = ("the dispatch is an all-to-all: each rank sends each row to the one rank "
                  "holding its expert, and first its counts per expert, with an all-to-all too")
DISPATCH_HINT = ("count this rank's rows per expert, exchange the counts with "
                 "dist.all_to_all_single (E/ep to each rank), sort the rows by expert (stable), "
                 "then all_to_all_single with output_split_sizes = rows from each rank, "
                 "input_split_sizes = rows to each rank")
ALLOWED = ("all_to_all", "all_to_all_single")


@fresh_cases
def check_dispatch_to_experts(dispatch_to_experts, timeout=CHECK_TIMEOUT_S, *, rng):
    """dispatch_to_experts(x (N_r, h), experts (N_r,), n_experts, group) -> (rows (R, h),
    counts (ep, E/ep)) on every rank: the rows all ranks route to this rank's experts, by source
    rank, then local expert, then their order on the source; counts[s, j] rows from rank s for
    local expert j."""
    __tracebackhide__ = True
    expect_callable(dispatch_to_experts, "dispatch_to_experts")
    eps = [2, 3, 4]
    rng.shuffle(eps)
    for i, ep in enumerate(eps):
        _check_case(dispatch_to_experts, ep, rng, idle_rank=i == 0, wide=i == 1,
                    timeout=timeout)
    ranks = ", ".join(map(str, eps))
    print(f"dispatch_to_experts: passed on {len(eps)} cases drawn at random ({ranks} ranks;"
          " uneven splits, an idle expert in each, a rank with no rows in one, rows of "
          f"{WIRE_FLOOR} bytes or more to every rank in one): every rank got its rows in order, "
          "sent its own rows once and its counts, no more, and received its rows' bytes")


def _draw_case(ep, rng, idle_rank, wide=False):
    """Every rank's rows and experts: uneven, one expert never chosen, with idle_rank every
    expert of one rank never chosen; otherwise drawn again until the case tells the orders apart
    (a rank sends two rows to one expert; a rank receives from two sources for two experts).
    With `wide`, rows of WIRE_FLOOR bytes or more, and every rank routes one to every rank."""
    n_experts = ep * rng.randint(2, 3)
    n_local = n_experts // ep
    idle = set()
    if idle_rank:
        d = rng.randrange(ep)
        idle = set(range(d * n_local, (d + 1) * n_local))
    idle.add(rng.choice([e for e in range(n_experts) if e not in idle]))
    used = [e for e in range(n_experts) if e not in idle]
    width, dtype = rng.randint(16, 24), rng.choice([torch.float32, torch.float64])
    if wide:
        width = max(width, -(-WIRE_FLOOR // dtype.itemsize))
    gen = torch.Generator().manual_seed(rng.randrange(2**62))
    for _ in range(100):  # most draws tell the orders apart at once
        sizes = [rng.randint(4, 9) for _ in range(ep)]
        chosen = [[rng.choice(used) for _ in range(n)] for n in sizes]
        if wide:
            chosen = [_to_every_rank(c, used, n_local, ep, rng) for c in chosen]
        experts = [torch.tensor(c) for c in chosen]
        if idle_rank or _tells_orders_apart(experts, n_experts, ep):
            break
    xs = [torch.randn(n, width, generator=gen, dtype=dtype) for n in sizes]
    return xs, experts, n_experts


def _to_every_rank(chosen, used, n_local, ep, rng):
    """`chosen` (a rank's experts, ep or more) with its first ep replaced by one used expert of
    each rank, its own included, then shuffled. Each rank holds a used expert: one is idle. A
    rank that sent every row to every rank would then receive a row it does not need from each."""
    every = [rng.choice([e for e in used if e // n_local == d]) for d in range(ep)]
    chosen = every + chosen[len(every):]
    rng.shuffle(chosen)
    return chosen


def _tells_orders_apart(experts, n_experts, ep):
    n_local = n_experts // ep
    repeats = any(len(set(e.tolist())) < len(e) for e in experts)
    for d in range(ep):
        got = [(s, j) for s in range(ep) for j in range(n_local)
               if bool((experts[s] == d * n_local + j).any())]
        if repeats and got != sorted(got, key=lambda sj: (sj[1], sj[0])):
            return True
    return False


def _check_case(dispatch_to_experts, ep, rng, idle_rank, timeout, wide=False):
    __tracebackhide__ = True
    xs, experts, n_experts = _draw_case(ep, rng, idle_rank, wide)
    must = _rows_from_others(xs, experts, n_experts)
    received = {}  # {rank: bytes}, counted by the kernel
    where = (f"dispatch_to_experts on {ep} ranks, E={n_experts}, x: "
             f"{str(xs[0].dtype).removeprefix('torch.')} rows of {xs[0].size(1)}")
    outcomes = run_on_ranks(dispatch_to_experts, [(x, e, n_experts) for x, e in zip(xs, experts)],
                            exercise="dispatch_to_experts", where=where, hint=DISPATCH_HINT,
                            forbid=tuple(c for c in COLLECTIVES if c not in ALLOWED),
                            why_forbidden=WHY_ALL_TO_ALL, harness=dispatch_in_rank,
                            guard=ANSWERS.in_rank, timeout=timeout,
                            receives=must, received=received)
    for r, ((got, sent), (x_after, e_after, _)) in enumerate(outcomes):
        if not (torch.equal(x_after, xs[r]) and torch.equal(e_after, experts[r])):
            fail(where, r, "changed its x or experts in place: the caller still needs them",
                 "sort a copy: x[order] makes a new tensor")
        _expect_dispatched(got, xs, experts, n_experts, r, where)
        most = xs[r].numel() * xs[r].element_size() + 8 * n_experts
        if sent > most:
            fail(where, r, f"sent {sent} bytes (all-to-alls and sends), but its rows are "
                           f"{xs[r].numel() * xs[r].element_size()} bytes and its counts at most "
                           f"8 · E = {8 * n_experts}: a rank sends each of its rows once, to "
                           "the rank that holds the row's expert, not to every rank",
                 DISPATCH_HINT)
    # beyond the rows, the counts (E int64 at most from each peer) and a few messages' headers
    expect_received_at_most(received, [rows + (8 * n_experts + HEADER_ROOM) * (ep - 1)
                                       for rows in must], where, DISPATCH_HINT)


def _rows_from_others(xs, experts, n_experts):
    """[per rank: bytes of the other ranks' rows routed to its experts]: what it must receive."""
    n_local, ep = n_experts // len(xs), len(xs)
    return [sum(int((experts[s] // n_local == r).sum()) * xs[s].size(1) * xs[s].element_size()
                for s in range(ep) if s != r) for r in range(ep)]


def _as_tensor(value, dtype=None):
    try:
        return torch.as_tensor(value, dtype=dtype)
    except (TypeError, ValueError, RuntimeError):
        return None


def _expect_dispatched(got, xs, experts, n_experts, r, where):
    __tracebackhide__ = True
    ep = len(xs)
    want_rows, want_counts = dispatched(xs, experts, n_experts, r)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(where, r, f"returned {kind(got)}, expected (rows, counts)", DISPATCH_HINT)
    rows, counts = got
    counts = _as_tensor(counts)
    if counts is None or tuple(counts.shape) != tuple(want_counts.shape) \
            or not torch.equal(counts.to(torch.int64), want_counts):
        fail(where, r, f"returned counts {_show(counts)}, expected {want_counts.tolist()} (row s: "
                       "what rank s sent to each of this rank's experts)",
             _counts_hint(counts, want_counts))
    if not isinstance(rows, torch.Tensor):  # a numpy array comes back as nested lists
        rows = _as_tensor(rows, want_rows.dtype) if rows is not None else None
        rows = rows.reshape(want_rows.shape) if rows is not None and not rows.numel() else rows
    if not isinstance(rows, torch.Tensor) or rows.shape != want_rows.shape \
            or rows.dtype != want_rows.dtype:
        fail(where, r, f"returned rows {kind(rows)}, expected {_describe(want_rows)}: every row "
                       "routed to this rank's experts", DISPATCH_HINT)
    if not torch.equal(rows, want_rows):
        fail(where, r, "returned the wrong rows or the right rows in another order",
             _order_hint(rows, want_rows, want_counts))


def _describe(t):
    return f"{str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"


def _show(t):
    return "nothing tensor-like" if t is None else str(t.tolist())


def _counts_hint(counts, want):
    if counts is not None and counts.dim() == 2 and counts.shape == want.T.shape \
            and torch.equal(counts.to(torch.int64), want.T):
        return "that is transposed: row s is source rank s, column j local expert j"
    return ("each rank counts its rows per expert (E values) and sends rank d the E/ep counts "
            "of d's experts: an all-to-all of the counts")


def _order_hint(rows, want, counts):
    """Which order the rows came in: by expert first, or with an expert's rows reordered."""
    ep, n_local = counts.shape
    groups = list(want.split(counts.flatten().tolist()))  # (source, expert) groups
    by_expert = [groups[s * n_local + j] for j in range(n_local) for s in range(ep)]
    if by_expert and torch.equal(rows, torch.cat(by_expert)):
        return ("those are sorted by expert: return them as the all-to-all delivers them, by "
                "source rank, then expert")
    if torch.equal(rows.sort(dim=0).values, want.sort(dim=0).values):
        return ("the right rows in another order: within one expert keep the order the rows "
                "had on their rank (a stable sort: torch.sort(..., stable=True))")
    return DISPATCH_HINT
