"""Lesson 08's check of ring_attention_step (`dlcourse/checks/context/ring_attention_step.py`) on
real gloo ranks: cp steps on each of cp ranks must make causal attention over the blocks held so far
(float64, computed by the check), the blocks passed around the ring by send/recv. Correct rings
written other ways pass; a deadlock, a collective, the wrong mask, an overflowing softmax, a
replaced instead of merged result and the lesson's or torch's ring fail, saying which."""

import math
import os
import pickle
import shutil
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from checking import HANG_TIMEOUT_S, first_line_and_hint
from dlcourse.checks.context import check_ring_attention_step


def _block(q, kv, seen):
    """(out, lse) of q against one block, the rows that see no key as out 0, lse -inf."""
    k, v = kv
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~seen, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0) @ v, lse


def _merge(out_1, lse_1, out_2, lse_2):
    lse = torch.logaddexp(lse_1, lse_2)
    return (torch.exp(lse_1 - lse).unsqueeze(-1) * out_1
            + torch.exp(lse_2 - lse).unsqueeze(-1) * out_2), lse


def ring_attention_step(q, kv, out, lse, q_pos, kv_pos, group):  # the solution notebook's
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % cp)])
    seen = q_pos[:, None] >= kv_pos[None, :]
    if seen.any():
        out, lse = _merge(out, lse, *_block(q, kv, seen))
    for work in works:
        work.wait()
    return out, lse, kv_next


def the_other_way_round(q, kv, out, lse, q_pos, kv_pos, group):  # isend left, recv from right
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    send = dist.isend(kv, dist.get_global_rank(group, (rank - 1) % cp), group)  # global dst
    kv_next = torch.empty_like(kv)
    dist.recv(kv_next, dist.get_global_rank(group, (rank + 1) % cp), group)
    send.wait()
    out, lse = _merge(out, lse, *_block(q, kv, q_pos[:, None] >= kv_pos[None, :]))
    return out, lse, kv_next


def by_parity_with_a_large_mask(q, kv, out, lse, q_pos, kv_pos, group):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    if rank % 2 == 0:  # even ranks send first, odd ranks receive first: no deadlock
        dist.send(kv, group=group, group_dst=(rank + 1) % cp)
        dist.recv(kv_next, group=group, group_src=(rank - 1) % cp)
    else:
        dist.recv(kv_next, group=group, group_src=(rank - 1) % cp)
        dist.send(kv, group=group, group_dst=(rank + 1) % cp)
    k, v = kv  # -1e30 instead of -inf: a row that sees nothing gets weight exp(-1e30) = 0
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(q_pos[:, None] < kv_pos[None, :], -1e30)
    block_lse = torch.logsumexp(scores, dim=-1)
    new_lse = torch.logaddexp(lse, block_lse)
    out = (torch.exp(lse - new_lse).unsqueeze(-1) * out
           + torch.softmax(scores, dim=-1) @ v * torch.exp(block_lse - new_lse).unsqueeze(-1))
    return out, new_lse, kv_next


def test_the_solution_passes(capsys):
    check_ring_attention_step(ring_attention_step)
    assert "ring_attention_step: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [the_other_way_round, by_parity_with_a_large_mask])
def test_other_correct_rings_pass(answer, capsys):
    # the ring the other way round; blocking send/recv ordered by parity (with an odd cp
    # ranks cp - 1 and 0 both send first, and rank 1's receive frees rank 0, then cp - 1)
    check_ring_attention_step(answer)
    assert "ring_attention_step: passed" in capsys.readouterr().out


def blocking_sends_first(q, kv, out, lse, q_pos, kv_pos, group):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    dist.send(kv, group=group, group_dst=(rank + 1) % cp)  # waits for a recv nobody posted
    dist.recv(kv_next, group=group, group_src=(rank - 1) % cp)
    return out, lse, kv_next


def gathers_the_blocks(q, kv, out, lse, q_pos, kv_pos, group):
    blocks = [torch.empty_like(kv) for _ in range(dist.get_world_size(group))]
    dist.all_gather(blocks, kv, group=group)
    return out, lse, blocks[(dist.get_rank(group) - 1) % len(blocks)]


def diagonal_masked(q, kv, out, lse, q_pos, kv_pos, group):
    return _with_mask(q, kv, out, lse, group, q_pos[:, None] > kv_pos[None, :])


def local_positions(q, kv, out, lse, q_pos, kv_pos, group):
    n = q.size(2)
    return _with_mask(q, kv, out, lse, group, torch.ones(n, n, dtype=torch.bool).tril())


def _with_mask(q, kv, out, lse, group, seen):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % cp)])
    out, lse = _merge(out, lse, *_block(q, kv, seen))
    for work in works:
        work.wait()
    return out, lse, kv_next


def softmax_without_the_max(q, kv, out, lse, q_pos, kv_pos, group):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % cp)])
    k, v = kv
    weights = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))  # overflows at 710
    weights = weights * (q_pos[:, None] >= kv_pos[None, :])
    total = weights.sum(-1)
    block_out = (weights @ v) / total.unsqueeze(-1)
    out, lse = _merge(out, lse, block_out.nan_to_num(0.0), torch.log(total))
    for work in works:
        work.wait()
    return out, lse, kv_next


def replaces_instead_of_merging(q, kv, out, lse, q_pos, kv_pos, group):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % cp)])
    seen = q_pos[:, None] >= kv_pos[None, :]
    if seen.any():
        out, lse = _block(q, kv, seen)
    for work in works:
        work.wait()
    return out, lse, kv_next


def recomputes_from_kept_blocks(q, kv, out, lse, q_pos, kv_pos, group, kept=[]):
    """No merge: keeps every block it held (the whole K/V in the end) and recomputes; right
    from (0, -inf), wrong where the (out, lse) it is given holds keys it never saw."""
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % cp)])
    kept.append((kv.clone(), kv_pos.clone()))
    k_all, v_all = (torch.cat([b[i] for b, _ in kept], dim=2) for i in (0, 1))
    pos = torch.cat([p for _, p in kept])
    out, lse = _block(q, torch.stack([k_all, v_all]), q_pos[:, None] >= pos[None, :])
    for work in works:
        work.wait()
    return out, lse, kv_next


def from_the_lesson(q, kv, out, lse, q_pos, kv_pos, group):
    from dlcourse.parallel.context.ring import start_exchange, wait
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    right, left = (dist.get_global_rank(group, (rank + i) % cp) for i in (1, -1))
    wait(start_exchange(kv, kv_next, right, left, group, 0))
    return out, lse, kv_next


def returns_the_block_it_sent(q, kv, out, lse, q_pos, kv_pos, group):
    ring_attention_step(q, kv, out, lse, q_pos, kv_pos, group)
    return (*ring_attention_step(q, kv, out, lse, q_pos, kv_pos, group)[:2], kv)


def only_for_four_ranks(q, kv, out, lse, q_pos, kv_pos, group):  # the lesson's cp = 4
    rank = dist.get_rank(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, kv, group=group, group_peer=(rank + 1) % 4),
        dist.P2POp(dist.irecv, kv_next, group=group, group_peer=(rank - 1) % 4)])
    out, lse = _merge(out, lse, *_block(q, kv, q_pos[:, None] >= kv_pos[None, :]))
    for work in works:
        work.wait()
    return out, lse, kv_next


SHARED = tempfile.mkdtemp(prefix="dlcourse-ring-side-")  # a folder every rank can read


@pytest.fixture(autouse=True, scope="module")
def _remove_shared():
    yield
    shutil.rmtree(SHARED, ignore_errors=True)


def through_the_store(q, kv, out, lse, q_pos, kv_pos, group, calls=[]):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    store, step = dist.distributed_c10d._get_default_store(), len(calls)
    calls.append(step)
    store.set(f"{step}:{rank}", pickle.dumps(kv))
    kv_next = pickle.loads(store.get(f"{step}:{(rank - 1) % cp}"))
    out, lse = _merge(out, lse, *_block(q, kv, q_pos[:, None] >= kv_pos[None, :]))
    return out, lse, kv_next


def through_a_file(q, kv, out, lse, q_pos, kv_pos, group, calls=[]):
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    step = len(calls)
    calls.append(step)
    path = os.path.join(SHARED, f"{os.getppid()}-{step}-{dist.get_rank()}")  # global: unique
    with open(path + ".part", "wb") as f:
        pickle.dump(kv, f)
    os.replace(path + ".part", path)  # whole or not at all
    left = os.path.join(SHARED, f"{os.getppid()}-{step}-"
                        f"{dist.get_global_rank(group, (rank - 1) % cp)}")
    while not os.path.exists(left):
        time.sleep(0.005)
    with open(left, "rb") as f:
        kv_next = pickle.load(f)
    out, lse = _merge(out, lse, *_block(q, kv, q_pos[:, None] >= kv_pos[None, :]))
    return out, lse, kv_next


WHERE = "ring_attention_step on "


@pytest.mark.parametrize("wrong, says, hint", [
    (gathers_the_blocks, "called dist.all_gather, which this exercise does not allow", None),
    (diagonal_masked, "at step 0 (holding rank ", "each query's own key is masked"),
    (local_positions, "the blocks of ranks", "built from local indices"),
    (softmax_without_the_max, "causal attention over the", "overflows float64"),
    # at step 0 of the case that starts from a prefix, else at step 1: either names the merge
    (replaces_instead_of_merging, " (holding rank ", "alone: merge"),
    (from_the_lesson, "called start_exchange from dlcourse.parallel.context.ring", None),
    (returns_the_block_it_sent, "returned the block it sent as kv_next", None),
    (through_the_store, "used the c10d store", None),  # issue 28's side channels
    (through_a_file, "sent 0 bytes through send, expected the block's", None),
    (recomputes_from_kept_blocks, "causal attention over the prefix and the blocks of ranks",
     "that is attention over the blocks alone"),
])
def test_wrong_ring_steps_fail_saying_why(wrong, says, hint):
    first, rest = first_line_and_hint(check_ring_attention_step, wrong)
    assert first.startswith(WHERE) and says in first, first
    if hint:
        assert hint in rest, rest


def group_ranks_as_peers(q, kv, out, lse, q_pos, kv_pos, group):
    """The solution as it was (issue 35): group ranks passed where torch reads global ones.
    Right when the group is the world (or ranks 0..cp-1); on ranks cp..2cp-1 it names ranks
    outside the group."""
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    kv_next = torch.empty_like(kv)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, (rank + 1) % cp, group),
                                    dist.P2POp(dist.irecv, kv_next, (rank - 1) % cp, group)])
    out, lse = _merge(out, lse, *_block(q, kv, q_pos[:, None] >= kv_pos[None, :]))
    for work in works:
        work.wait()
    return out, lse, kv_next


def test_group_ranks_passed_as_global_peers_fail_naming_group_peer():
    # torch raises at once (a peer outside the group): no hang to wait for, default timeout
    first, rest = first_line_and_hint(check_ring_attention_step, group_ranks_as_peers)
    assert first.startswith(WHERE + "a dp 2 x cp "), first  # the grid's, whichever comes first
    assert "group_peer=" in first + rest and "get_global_rank" in first + rest, first + rest


def test_a_ring_of_four_fails_on_other_sizes():
    # a case with cp != 4 comes in every run: a rank that is not there raises, or a ring
    # with a missing link waits (reported at the timeout)
    first, _ = first_line_and_hint(check_ring_attention_step, only_for_four_ranks,
                                   timeout=HANG_TIMEOUT_S)
    assert first.startswith(WHERE), first


def test_blocking_sends_on_every_rank_deadlock_and_say_so():
    first, rest = first_line_and_hint(check_ring_attention_step, blocking_sends_first,
                                      timeout=HANG_TIMEOUT_S)
    assert first.startswith(WHERE) and f"did not finish within {HANG_TIMEOUT_S:g} s" in first
    assert "each starts with a blocking dist.send" in rest
