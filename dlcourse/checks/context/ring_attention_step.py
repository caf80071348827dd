"""Lesson 08, exercise 3: one step of ring attention, on real ranks.

    check_ring_attention_step(ring_attention_step)

ring_attention_step(q, kv, out, lse, q_pos, kv_pos, group) -> (out, lse, kv_next): send the K/V
block this rank holds, kv (2, b, a, n, d), to its neighbour on the ring and receive the next one
from the other side, attend the queries q (b, a, n, d) to kv under the causal mask (from the
global positions q_pos and kv_pos), and merge that into the running (out, lse). The check's
harness (`in_rank.ring_in_rank`) calls it cp times on each of cp ranks, from out = 0 and lse = -inf
(in one case from the attention over a prefix of keys every query sees, so that a step that
recomputes from blocks it kept instead of merging into what it is given fails), each rank sent
only its own tokens; after step j the result must equal plain causal attention over the keys
the rank has seen (`reference.attention`, float64, computed here after the ranks returned), the
block received must be the neighbour's, and it must have come through send/recv (collectives
refused), one block's bytes to one neighbour per step, and the kernel's count of what each
rank received, outside it, must be its cp blocks and headers, no fewer (a block moved by file,
its counter faked) and no more (blocks sent twice, records cleared): one case has blocks of
`WIRE_FLOOR` bytes or more, clear of gloo's headers. A ring either way round passes. Cases
drawn per run: 2 to 5 ranks, contiguous and zig-zag layouts, one case with scores in the
thousands (exp overflows float64 there unless the max is subtracted), and one where the CP group
is not the world: a dp 2 x cp grid, cp innermost (torchtitan's mesh order with no TP; lesson
07's grid), whose CP groups are ranks 0..cp-1 and cp..2cp-1, each running its own ring on its
own data. In the second group rank and global rank differ, and torch 2.13 reads `peer` (P2POp) and `dst`/`src` (isend,
send, ...) as global ranks, the group's own numbering going in `group_peer=`/`group_dst=`/
`group_src=` (`distributed_c10d.py`, `P2POp.__init__` and `_canonicalize_group_rank`): a step
that passes `(rank + 1) % cp` as `peer` names a rank outside its group, and fails naming both.
(Outside, never itself: an isend to oneself is not refused by torch and waits forever, which
the check could only report as a hang.)
"""

import torch

from dlcourse.checks.context.answers import ANSWERS
from dlcourse.checks.context.in_rank import GROUP_RANKS, fingerprint, ring_in_rank
from dlcourse.checks.context.reference import attention, contiguous, normal, world_sizes, zigzag
from dlcourse.checks.context.ring_mistakes import RING_HINT, explain, keys_seen
from dlcourse.checks.core import (CHECK_TIMEOUT_S, COLLECTIVES, describe, expect_callable, fail,
                                  fresh_cases, run_on_ranks)
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, wire_floor_units

WHY_P2P = ("the K/V blocks go around the ring with point-to-point ops: dist.send/recv, "
           "isend/irecv or batch_isend_irecv")
RING_HANG = ("every rank calls ring_attention_step at once: if each starts with a blocking "
             "dist.send, each waits for a recv that nobody has posted yet. Post the receive "
             "(dist.irecv) or the send (dist.isend) without waiting, or use "
             "dist.batch_isend_irecv, then wait")
# float64 rounds at ~1e-16; the ring adds the blocks in another order than one softmax. 1e-10
# leaves 10^5 times that (the scores of a few thousand round lse at ~1e-13); the mistakes named
# below move values by O(1) or make them NaN.
RTOL, ATOL = 1e-10, 1e-12


def _shape(rng, layout, wide=False):
    """(b, a, n, d) of one case: n tokens a rank, even in the zig-zag layout (two chunks);
    `wide`: d large enough that a K/V block (2, b, a, n, d) is WIRE_FLOOR bytes or more."""
    n = 2 * rng.randint(1, 2) if layout == "zigzag" else rng.randint(2, 4)
    b, a, d = rng.randint(1, 2), rng.randint(1, 2), rng.randint(2, 4)
    if wide:  # float64 blocks
        d = max(d, wire_floor_units(2 * b * a * n * 8))
    return b, a, n, d


def _case(rng, cp, layout, scale, prefixed, shape):
    """One CP group's q and kv (2, b, a, n, d) per rank, the positions table (cp, n), and a
    prefix: keys and values (2, b, a, m, d) at position -1 that every query sees, or None."""
    b, a, n, d = shape
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


@fresh_cases
def check_ring_attention_step(ring_attention_step, timeout=CHECK_TIMEOUT_S, *, rng):
    """cp calls of ring_attention_step on each of cp ranks make causal attention over the whole
    sequence, one block at a time, the blocks passed around the ring with send/recv; in one
    case the CP group is half of a 2 x cp grid, so that its ranks are not the world's."""
    __tracebackhide__ = True
    expect_callable(ring_attention_step, "ring_attention_step")
    sizes = world_sizes(rng, 3, 2, 5)
    layouts = ["contiguous", "zigzag", rng.choice(["contiguous", "zigzag"])]
    scales = [1.0, 1.0, 1000.0]
    prefixed = [True, False, False]  # one case starts from a prefix's (out, lse), not (0, -inf)
    groups = [2, 1, 1]  # one case: two CP groups of cp ranks each (at most 3: 6 ranks in all)
    rng.shuffle(layouts)
    rng.shuffle(groups)
    sizes = [min(cp, 3) if g > 1 else cp for cp, g in zip(sizes, groups)]
    wide = rng.randrange(len(sizes))  # the case whose blocks stand clear of gloo's headers
    for i, case in enumerate(zip(sizes, layouts, scales, prefixed, groups)):
        _check_case(ring_attention_step, rng, *case, timeout, wide=i == wide)
    print(f"ring_attention_step: passed on {len(sizes)} cases drawn at random "
          f"({', '.join(f'{g} x {cp}' if g > 1 else str(cp) for cp, g in zip(sizes, groups))} "
          "ranks; contiguous and zig-zag; scores up to thousands; one from a prefix's result; "
          "one on the two CP groups of a dp x cp grid): after every step each rank's "
          "output equals causal attention over the keys it has seen, the blocks went around its "
          f"group's ring by send/recv, one block a step ({WIRE_FLOOR} bytes or more in one "
          "case), and each rank received its blocks, no fewer and no more (counted outside it)")


def _check_case(step_fn, rng, cp, layout, scale, prefixed, groups, timeout, wide=False):
    __tracebackhide__ = True
    shape = _shape(rng, layout, wide)
    cases = [_case(rng, cp, layout, scale, prefixed, shape) for _ in range(groups)]
    world = groups * cp
    members = [list(range(k * cp, (k + 1) * cp)) for k in range(groups)]  # cp innermost
    kv_of = {g: cases[g // cp][1][g % cp] for g in range(world)}  # global rank -> kv
    fingerprints = torch.stack([fingerprint(kv_of[g]) for g in range(world)])  # (world, 2)
    positions = cases[0][2]  # every group: the same layout
    on = (f"{cp} ranks" if groups == 1 else
          f"a dp {groups} x cp {cp} grid of {world} ranks, the CP groups "
          + " and ".join(str(m) for m in members))
    where = (f"ring_attention_step on {on}, {layout} layout, q: {describe(cases[0][0][0])}, "
             f"scores ~{scale:g} x N(0, 1)"
             + (f", starting from the (out, lse) of {cases[0][3].size(3)} keys every query sees"
                if prefixed else ""))
    rank_args = [(cases[g // cp][0][g % cp], kv_of[g], positions, fingerprints,
                  _start(cases[g // cp][0][g % cp], cases[g // cp][3]), groups)
                 for g in range(world)]  # the prefix's attention computed here, not in a rank
    received = {}  # {global rank: bytes}, counted by the kernel, outside the ranks
    outcomes = run_on_ranks(step_fn, rank_args,
                            exercise="ring_attention_step", where=where, hint=RING_HINT,
                            forbid=COLLECTIVES, why_forbidden=WHY_P2P, hang_hint=RING_HANG,
                            harness=ring_in_rank, guard=ANSWERS.in_rank, timeout=timeout,
                            received=received)
    for k, ranks in enumerate(members):
        qs, kvs, _, prefix = cases[k]
        steps = [_in_group(outcomes[g][0], ranks, where, g) for g in ranks]  # steps[r][j]
        direction = _direction(steps, cp)
        for j in range(cp):
            for r in range(cp):
                _expect_step(steps[r], j, r, qs[r], kvs, positions, prefix, where,
                             _who(r, ranks, groups))
            for r in range(cp):
                _expect_transfer(steps[r][j], j, r, cp, direction, kvs[r], where,
                                 _who(r, ranks, groups))
    # every rank: cp blocks from its neighbour on the ring, its counter faked or not
    block = [kv_of[g].numel() * kv_of[g].element_size() * cp for g in range(world)]
    expect_received_data(received, block, where, RING_HINT, least=block,
                         peers=[min(2, cp - 1)] * world)


def _who(r, ranks, groups):
    """How a failure names rank r of a CP group: its number, and on a grid its group."""
    return r if groups == 1 else f"{r} of the CP group {ranks} (global rank {ranks[r]})"


def _in_group(steps, ranks, where, g):
    """A rank's steps with the block that came back named by its rank in the group (None if
    it is no rank's); a block from another CP group fails, naming the global ranks."""
    __tracebackhide__ = True
    named = []
    for j, (held, out, lse, src, moved, problem) in enumerate(steps):
        if src is not None and src not in ranks:
            fail(where, _who(ranks.index(g), ranks, 2), f"at step {j} returned as kv_next the "
                 f"block of global rank {src}, which is not in its CP group", GROUP_RANKS)
        named.append((held, out, lse, None if src is None else ranks.index(src), moved,
                      problem))
    return named


def _direction(steps, cp):
    """+1 if rank 0 got the block of rank cp - 1 (its left) at the first step, -1 if its right
    neighbour's (the ring the other way round), +1 when neither (the check names the fault)."""
    src = steps[0][0][3]
    return -1 if src == 1 % cp and cp > 2 else 1


def _expect_step(steps, j, r, q, kvs, positions, prefix, where, who):
    """After step j rank r's (out, lse) is attention over the keys it has seen: the prefix, if
    any, and the blocks it held at steps 0..j."""
    __tracebackhide__ = True
    held, out, lse, _, _, problem = steps[j]
    at = f"at step {j} (holding rank {held}'s block)"
    if problem is not None:
        fail(where, who, f"{at} {problem}", RING_HINT)
    owners = [s[0] for s in steps[:j + 1]]
    k, v, k_pos, _ = keys_seen(kvs, positions, owners, prefix)
    want_out, want_lse = attention(q, k, v, positions[r], k_pos)
    seen = ("the prefix and " if prefix is not None else "") + f"the blocks of ranks {owners}"
    for name, got, want in (("lse", lse, want_lse), ("out", out, want_out)):
        ok = torch.isclose(got, want, rtol=RTOL, atol=ATOL)
        if ok.all():
            continue
        i = tuple((~ok).nonzero()[0].tolist())
        fail(where, who, f"{at}: {name}{list(i)} is {got[i].item():.6g}, causal attention over "
                        f"{seen} gives {want[i].item():.6g} "
                        f"({int((~ok).sum())} of {ok.numel()} differ)",
             explain(name, got, q, kvs, held, owners, positions, prefix, r, j))


def _expect_transfer(step, j, r, cp, direction, kv, where, who):
    """The block that came back is the neighbour's, sent and received by send/recv, one
    block's bytes each way, to and from the two neighbours of the ring."""
    __tracebackhide__ = True
    held, _, _, src, moved, _ = step
    at = f"at step {j} (holding rank {held}'s block)"
    want_src, right, left = (held - direction) % cp, (r + direction) % cp, (r - direction) % cp
    if src is None:
        fail(where, who, f"{at} returned a kv_next that is no rank's K/V block",
             "receive the next block from the previous rank into a new buffer "
             "(torch.empty_like(kv)); kv itself is still being sent")
    if src != want_src:
        got = "the block it sent" if src == held else f"rank {src}'s block"
        fail(where, who, f"{at} returned {got} as kv_next, expected rank {want_src}'s, which its "
                        f"neighbour rank {left} held", RING_HINT)
    size = kv.numel() * kv.element_size()
    for op, peer, verb in (("send", right, "sent"), ("recv", left, "received")):
        peers = {p for o, p, _ in moved if o == op}
        total = sum(b for o, _, b in moved if o == op)
        if peers - {peer}:
            fail(where, who, f"{at} {verb} through {op} with ranks {sorted(peers)}: a ring step "
                            f"talks to its two neighbours only, {verb} with rank {peer}",
                 RING_HINT)
        if total != size:
            fail(where, who, f"{at} {verb} {total} bytes through {op}, expected the block's "
                            f"{size} bytes (K and V, once) a step", RING_HINT)
