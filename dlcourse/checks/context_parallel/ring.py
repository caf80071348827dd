"""Lesson 08, exercise 3: one step of ring attention, on real ranks.

    check_ring_attention_step(ring_attention_step)

ring_attention_step(q, kv, out, lse, q_pos, kv_pos, group) -> (out, lse, kv_next): send the K/V
block this rank holds, kv (2, b, a, n, d), to its neighbour on the ring and receive the next one
from the other side, attend the queries q (b, a, n, d) to kv under the causal mask (from the
global positions q_pos and kv_pos), and merge that into the running (out, lse). The check's
harness (`_ring_in_rank`) calls it cp times on each of cp ranks, from out = 0 and lse = -inf
(in one case from the attention over a prefix of keys every query sees, so that a step that
recomputes from blocks it kept instead of merging into what it is given fails), each rank sent
only its own tokens; after step j the result must equal plain causal attention over the keys
the rank has seen (`reference.attention`, float64, computed here after the ranks returned), the
block received must be the neighbour's, and it must have come through send/recv (collectives
refused), one block's bytes to one neighbour per step. A ring either way round passes. Cases drawn per run: 2 to 5 ranks, contiguous and zig-zag layouts, one case with
scores in the thousands (exp overflows float64 there unless the max is subtracted).
"""

import torch
import torch.distributed as dist

from dlcourse.checks.context_parallel.reference import (attention, attention_where, contiguous,
                                                        normal, world_sizes, zigzag)
from dlcourse.checks.context_parallel.refusals import refuse_context
from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, describe, expect_callable, fail,
                                  fresh_cases, run_on_ranks)
from dlcourse.collectives.counter import CommCounter

WHY_P2P = ("the K/V blocks go around the ring with point-to-point ops: dist.send/recv, "
           "isend/irecv or batch_isend_irecv")
RING_HANG = ("every rank calls ring_attention_step at once: if each starts with a blocking "
             "dist.send, each waits for a recv that nobody has posted yet. Post the receive "
             "(dist.irecv) or the send (dist.isend) without waiting, or use "
             "dist.batch_isend_irecv, then wait")
RING_HINT = ("send kv to rank (rank + 1) % cp, receive the next block from (rank - 1) % cp into "
             "a new buffer; attend q to kv with the mask q_pos >= kv_pos; merge with the "
             "log-sum-exps as in exercise 1")
# float64 rounds at ~1e-16; the ring adds the blocks in another order than one softmax. 1e-10
# leaves 10^5 times that (the scores of a few thousand round lse at ~1e-13); the mistakes named
# below move values by O(1) or make them NaN.
RTOL, ATOL = 1e-10, 1e-12


def _case(rng, cp, layout, scale, prefixed):
    """Each rank's q and kv (2, b, a, n, d), the positions table (cp, n), and a prefix: keys
    and values (2, b, a, m, d) at position -1 that every query sees, or None."""
    b, a, d = rng.randint(1, 2), rng.randint(1, 2), rng.randint(2, 4)
    n = 2 * rng.randint(1, 2) if layout == "zigzag" else rng.randint(2, 4)
    place = zigzag if layout == "zigzag" else contiguous
    positions = torch.tensor([place(r, cp, n * cp) for r in range(cp)])  # (cp, n)
    qs = [normal((b, a, n, d), rng, scale=scale) for _ in range(cp)]  # scores ~ scale x N(0,1)
    kvs = [normal((2, b, a, n, d), rng) for _ in range(cp)]
    prefix = normal((2, b, a, rng.randint(1, 3), d), rng) if prefixed else None
    return qs, kvs, positions, prefix


def _start(q, prefix):
    """(out, lse) before the first step: nothing seen (0, -inf), or the prefix's attention."""
    if prefix is None:
        return torch.zeros_like(q), torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    return attention(q, prefix[0], prefix[1], None, None, causal=False)


def fingerprint(kv):
    """Two numbers that tell the ranks' K/V blocks apart (random values: no two alike)."""
    return torch.stack([kv.sum(), (kv * kv).sum()])


def _ring_in_rank(student, q, kv, positions, fingerprints, prefix):
    """Runs in every rank: cp steps of the student's ring, from out = 0 and lse = -inf, or from
    the attention over a prefix (so that a step must merge into what it is given). Per
    step: (whose block it held, out, lse, whose block came back or None, the send/recv it made
    as (op, peer, bytes), a problem with what it returned or None). Every rank makes all cp
    calls whatever it got, so that one rank's mistake does not leave the others waiting."""
    rank, cp = dist.get_rank(), dist.get_world_size()
    out, lse = _start(q, prefix)  # (b, a, n, d), (b, a, n)
    held, steps = rank, []
    for _ in range(cp):
        with CommCounter() as comm:
            result = student(q.clone(), kv.clone(), out.clone(), lse.clone(),
                             positions[rank].clone(), positions[held].clone(), dist.group.WORLD)
        moved = [(r.op, r.peer, r.nbytes) for r in comm.records]
        got, problem = _unpack(result, q, kv)
        src = None
        if problem is None:
            out, lse, kv_next = got
            found = [r for r, f in enumerate(fingerprints)
                     if torch.allclose(fingerprint(kv_next), f, rtol=1e-12, atol=0)]
            src = found[0] if found else None
        steps.append((held, out, lse, src, moved, problem))
        if src is not None:
            held, kv = src, kv_next
    return steps


def _unpack(result, q, kv):
    """((out, lse, kv_next) as float64 tensors, None), or (None, what is wrong with them)."""
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return None, f"returned {_kind(result)}, expected (out, lse, kv_next)"
    shapes = (q.shape, q.shape[:-1], kv.shape)
    got = []
    for name, value, shape in zip(("out", "lse", "kv_next"), result, shapes):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return None, f"returned {_kind(value)} as {name}, expected numbers"
        if value.shape != shape:
            return None, (f"returned {name} of shape {tuple(value.shape)}, expected "
                          f"{tuple(shape)}")
        got.append(value)
    return got, None


@fresh_cases
def check_ring_attention_step(ring_attention_step, timeout=CHECK_TIMEOUT_S, *, rng):
    """cp calls of ring_attention_step on each of cp ranks make causal attention over the whole
    sequence, one block at a time, the blocks passed around the ring with send/recv."""
    __tracebackhide__ = True
    expect_callable(ring_attention_step, "ring_attention_step")
    sizes = world_sizes(rng, 3, 2, 5)
    layouts = ["contiguous", "zigzag", rng.choice(["contiguous", "zigzag"])]
    scales = [1.0, 1.0, 1000.0]
    prefixed = [True, False, False]  # one case starts from a prefix's (out, lse), not (0, -inf)
    rng.shuffle(layouts)
    for case in zip(sizes, layouts, scales, prefixed):
        _check_case(ring_attention_step, rng, *case, timeout)
    print(f"ring_attention_step: passed on {len(sizes)} cases drawn at random "
          f"({', '.join(map(str, sizes))} ranks; contiguous and zig-zag; scores up to "
          "thousands; one from a prefix's result): after every step each rank's output equals "
          "causal attention over the keys it has seen, the blocks went around the ring by "
          "send/recv, one block a step")


def _check_case(step_fn, rng, cp, layout, scale, prefixed, timeout):
    __tracebackhide__ = True
    qs, kvs, positions, prefix = _case(rng, cp, layout, scale, prefixed)
    fingerprints = torch.stack([fingerprint(kv) for kv in kvs])  # (cp, 2)
    where = (f"ring_attention_step on {cp} ranks, {layout} layout, q: {describe(qs[0])}, "
             f"scores ~{scale:g} x N(0, 1)"
             + (f", starting from the (out, lse) of {prefix.size(3)} keys every query sees"
                if prefixed else ""))
    outcomes = run_on_ranks(step_fn, [(q, kv, positions, fingerprints, prefix)
                                      for q, kv in zip(qs, kvs)],
                            exercise="ring_attention_step", where=where, hint=RING_HINT,
                            forbid=COLLECTIVES, why_forbidden=WHY_P2P, hang_hint=RING_HANG,
                            harness=_ring_in_rank, guard=refuse_context, timeout=timeout)
    steps = [value for value, _ in outcomes]  # steps[rank][j]
    direction = _direction(steps, cp)
    for j in range(cp):
        for r in range(cp):
            _expect_step(steps[r], j, r, qs[r], kvs, positions, prefix, where)
        for r in range(cp):
            _expect_transfer(steps[r][j], j, r, cp, direction, kvs[r], where)


def _direction(steps, cp):
    """+1 if rank 0 got the block of rank cp - 1 (its left) at the first step, -1 if its right
    neighbour's (the ring the other way round), +1 when neither (the check names the fault)."""
    src = steps[0][0][3]
    return -1 if src == 1 % cp and cp > 2 else 1


def _keys(kvs, positions, owners, prefix):
    """The keys a rank has seen after holding the blocks of `owners` (the prefix's first):
    k, v (b, a, m, d), their global positions and their local indices (m,) (the prefix's -1)."""
    blocks = ([prefix] if prefix is not None else []) + [kvs[o] for o in owners]
    k, v = (torch.cat([block[i] for block in blocks], dim=2) for i in (0, 1))
    before = [torch.full((prefix.size(3),), -1)] if prefix is not None else []
    k_pos = torch.cat(before + [positions[o] for o in owners])
    local = torch.cat(before + [torch.arange(positions.size(1)) for _ in owners])
    return k, v, k_pos, local


def _expect_step(steps, j, r, q, kvs, positions, prefix, where):
    """After step j rank r's (out, lse) is attention over the keys it has seen: the prefix, if
    any, and the blocks it held at steps 0..j."""
    __tracebackhide__ = True
    held, out, lse, _, _, problem = steps[j]
    at = f"at step {j} (holding rank {held}'s block)"
    if problem is not None:
        fail(where, r, f"{at} {problem}", RING_HINT)
    owners = [s[0] for s in steps[:j + 1]]
    k, v, k_pos, _ = _keys(kvs, positions, owners, prefix)
    want_out, want_lse = attention(q, k, v, positions[r], k_pos)
    seen = ("the prefix and " if prefix is not None else "") + f"the blocks of ranks {owners}"
    for name, got, want in (("lse", lse, want_lse), ("out", out, want_out)):
        ok = torch.isclose(got, want, rtol=RTOL, atol=ATOL)
        if ok.all():
            continue
        i = tuple((~ok).nonzero()[0].tolist())
        fail(where, r, f"{at}: {name}{list(i)} is {got[i].item():.6g}, causal attention over "
                       f"{seen} gives {want[i].item():.6g} "
                       f"({int((~ok).sum())} of {ok.numel()} differ)",
             _explain(name, got, q, kvs, held, owners, positions, prefix, r, j))


def _explain(name, got, q, kvs, held, owners, positions, prefix, r, j):
    """The hint for the commonest mistakes, recognised by what came back."""
    k, v, k_pos, local = _keys(kvs, positions, owners, prefix)
    q_pos, n = positions[r], q.size(2)
    pick = 0 if name == "out" else 1
    variants = [
        (q_pos[:, None] > k_pos[None, :], "each query's own key is masked: a query at position "
         "i sees the keys at positions j <= i, itself included (the diagonal)"),
        (torch.arange(n)[:, None] >= local[None, :], "the mask was built from local indices "
         "0..n-1: build it from the global positions q_pos and kv_pos, which say where each "
         "token sits in the whole sequence"),
        (None, "no causal mask: a query sees the keys at or before its own position only"),
    ]
    for seen, says in variants:
        if torch.allclose(got, attention_where(q, k, v, seen)[pick], rtol=1e-8, atol=1e-10):
            return says
    if prefix is not None:
        k, v, k_pos, _ = _keys(kvs, positions, owners, None)
        if torch.allclose(got, attention(q, k, v, q_pos, k_pos)[pick], rtol=1e-8, atol=1e-10):
            return ("that is attention over the blocks alone: merge the block into the (out, "
                    "lse) the step is given, which may hold keys it never saw (here a prefix)")
    alone = attention(q, kvs[held][0], kvs[held][1], q_pos, positions[held])
    if j > 0 and torch.allclose(got, alone[pick], rtol=1e-8, atol=1e-10):
        return ("that is this block's attention alone: merge it into the running (out, lse) "
                "with the log-sum-exps, as in exercise 1")
    if not torch.isfinite(got).all() and float(q.abs().max()) > 100:
        return ("inf or NaN where the scores are large: exp of a score or of an lse in the "
                "thousands overflows float64 (e^709); subtract the row's max before exp "
                "(torch.logsumexp and torch.logaddexp do)")
    if got.isnan().any():
        return ("NaN: a query that sees no key of this block has lse -inf there and a softmax "
                "of all -inf is NaN; skip such rows (or a block no query can see), or zero them "
                "before merging")
    return RING_HINT


def _expect_transfer(step, j, r, cp, direction, kv, where):
    """The block that came back is the neighbour's, sent and received by send/recv, one
    block's bytes each way, to and from the two neighbours of the ring."""
    __tracebackhide__ = True
    held, _, _, src, moved, _ = step
    at = f"at step {j} (holding rank {held}'s block)"
    want_src, right, left = (held - direction) % cp, (r + direction) % cp, (r - direction) % cp
    if src is None:
        fail(where, r, f"{at} returned a kv_next that is no rank's K/V block",
             "receive the next block from the previous rank into a new buffer "
             "(torch.empty_like(kv)); kv itself is still being sent")
    if src != want_src:
        got = "the block it sent" if src == held else f"rank {src}'s block"
        fail(where, r, f"{at} returned {got} as kv_next, expected rank {want_src}'s, which its "
                       f"neighbour rank {left} held", RING_HINT)
    size = kv.numel() * kv.element_size()
    for op, peer, verb in (("send", right, "sent"), ("recv", left, "received")):
        peers = {p for o, p, _ in moved if o == op}
        total = sum(b for o, _, b in moved if o == op)
        if peers - {peer}:
            fail(where, r, f"{at} {verb} through {op} with ranks {sorted(peers)}: a ring step "
                           f"talks to its two neighbours only, {verb} with rank {peer}",
                 RING_HINT)
        if total != size:
            fail(where, r, f"{at} {verb} {total} bytes through {op}, expected the block's "
                           f"{size} bytes (K and V, once) a step", RING_HINT)


def _kind(value):
    return describe(value) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
