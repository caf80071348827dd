"""The rank side of lesson 08's checks: what runs in each rank while a student's ring or
all-to-all runs there. It imports none of the lesson's code and holds no reference: under
`dlcourse grade` this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`,
`grading/absent.py`), the references (`reference.py`) run in the checking process.
"""

import re

import torch
import torch.distributed as dist

from dlcourse.checks.core import describe
from dlcourse.collectives.counter import CommCounter

GROUP_RANKS = ("torch 2.13 reads peer= (dist.P2POp) and dst=/src= (isend, irecv, send, recv) as "
               "GLOBAL ranks, whatever group you pass; dist.get_rank(group) is the rank within "
               "the group. On a CP group that is not the world they differ: pass the group's "
               "numbering as group_peer= (group_dst=/group_src=), or convert it with "
               "dist.get_global_rank(group, i)")


def fingerprint(kv):
    """Two numbers that tell the ranks' K/V blocks apart (random values: no two alike)."""
    return torch.stack([kv.sum(), (kv * kv).sum()])


def ring_in_rank(student, q, kv, positions, fingerprints, start, groups):
    """Runs in every rank: cp steps of the student's ring on this rank's CP group (the world,
    or with groups = 2 the first or the last cp ranks), from `start`: (out, lse) = (0, -inf),
    or the attention over a prefix, computed by the check (so that a step must merge into what
    it is given). Per step: (whose block it held, as a rank of its group; out; lse; the global
    rank whose block came back, or None; the send/recv it made as (op, peer within the group,
    bytes); a problem with what it returned, or None). Every rank makes all cp calls whatever
    it got, so that one rank's mistake does not leave the others waiting."""
    group = cp_group(groups)
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    out, lse = start  # (b, a, n, d), (b, a, n)
    held, steps = rank, []
    for _ in range(cp):
        with CommCounter() as comm:
            result = peers_explained(student, group, q.clone(), kv.clone(), out.clone(),
                                      lse.clone(), positions[rank].clone(),
                                      positions[held].clone(), group)
        moved = [(r.op, r.peer, r.nbytes) for r in comm.records]
        got, problem = unpack(result, q, kv)
        src = None
        if problem is None:
            out, lse, kv_next = got
            found = [g for g, f in enumerate(fingerprints)
                     if torch.allclose(fingerprint(kv_next), f, rtol=1e-12, atol=0)]
            src = found[0] if found else None
        steps.append((held, out, lse, src, moved, problem))
        if src is not None and src // cp == dist.get_rank() // cp:  # from its own group
            held, kv = src % cp, kv_next
    return steps


def cp_group(groups):
    """This rank's CP group: the world, or (groups = 2) a dp 2 x cp grid's, cp innermost:
    ranks 0..cp-1 or cp..2cp-1. Every rank makes every group (new_group asks it)."""
    if groups == 1:
        return dist.group.WORLD
    cp = dist.get_world_size() // groups
    made = [dist.new_group(list(range(k * cp, (k + 1) * cp))) for k in range(groups)]
    return made[dist.get_rank() // cp]


def unpack(result, q, kv):
    """((out, lse, kv_next) as float64 tensors, None), or (None, what is wrong with them)."""
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        return None, f"returned {kind_of(result)}, expected (out, lse, kv_next)"
    shapes = (q.shape, q.shape[:-1], kv.shape)
    got = []
    for name, value, shape in zip(("out", "lse", "kv_next"), result, shapes):
        try:
            value = torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            return None, f"returned {kind_of(value)} as {name}, expected numbers"
        if value.shape != shape:
            return None, (f"returned {name} of shape {tuple(value.shape)}, expected "
                          f"{tuple(shape)}")
        got.append(value)
    return got, None


def kind_of(value):
    return describe(value) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"


def peers_explained(student, group, *args):
    """student(*args); torch's error for a peer outside the group, or for a send to oneself,
    comes back saying which rank numbering torch reads."""
    try:
        return student(*args)
    except (ValueError, RuntimeError) as error:
        said = str(error)
        if "not part of group" not in said and "same as the rank of the current" not in said:
            raise
        members = dist.get_process_group_ranks(group)
        said = re.sub(r"<torch[^>]*>", f"{members}", said.splitlines()[0])
        raise ValueError(f"{said} (this is global rank {dist.get_rank()}, rank "
                         f"{dist.get_rank(group)} of the CP group of global ranks {members}). "
                         f"{GROUP_RANKS}") from None


def seq_to_heads_in_rank(student, x):
    """Runs in every rank: the student's function on this rank's x, and the bytes it sent."""
    with CommCounter() as comm:
        got = student(x.clone(), dist.group.WORLD)
    leaving = 0  # bytes that leave the rank: an all-to-all keeps its own 1/cp
    for r in comm.records:
        if r.op == "send":
            leaving += r.nbytes
        elif r.op == "all_to_all":
            leaving += r.nbytes * (r.group_size - 1) // r.group_size
    return got, leaving
