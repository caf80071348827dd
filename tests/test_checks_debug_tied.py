"""Lesson 10, exercise 5 (`dlcourse/checks/debug/sync_tied_grads.py`): the fix of the catalogue's
`pp_tied_embeddings_unsynced`, in lesson 06's 1F1B trainer on 2 and 3 stages, compared with one
process, gradients and parameters, over 2 AdamW steps. The exchange posted together
(batch_isend_irecv) and one in blocking send/recv, ordered by rank, both pass; sending the
parameter across instead (the copies equal, the gradient still missing the output layer's part),
a fix that knows only ranks 0 and 1, and one that completes the first stage's copy only fail with
the hint that names the mistake; lesson 06's own exchange is refused."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from checking import fails_on_a_case, first_line_and_hint
from dlcourse.checks.debug import check_sync_tied_grads


def _ends(stages):
    first = next((s.tok_emb.weight for s in stages if s.is_first), None)
    last = next((s.lm_head.weight for s in stages if s.is_last), None)
    return first, last


def _peer(group, first):
    return dist.get_global_rank(group, dist.get_world_size(group) - 1 if first is not None else 0)


def sync_tied_grads(stages, group):  # both posted together
    first, last = _ends(stages)
    if first is None and last is None:
        return
    mine = first if first is not None else last
    theirs = torch.empty_like(mine.grad)
    peer = _peer(group, first)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine.grad, peer, group),
                                        dist.P2POp(dist.irecv, theirs, peer, group)]):
        work.wait()
    mine.grad.add_(theirs)


def blocking_in_rank_order(stages, group):  # the first stage sends first, the last receives first
    first, last = _ends(stages)
    if first is None and last is None:
        return
    mine = first if first is not None else last
    theirs, peer = torch.empty_like(mine.grad), _peer(group, first)
    if first is not None:
        dist.send(mine.grad, peer, group=group)
        dist.recv(theirs, peer, group=group)
    else:
        dist.recv(theirs, peer, group=group)
        dist.send(mine.grad, peer, group=group)
    mine.grad.add_(theirs)


def parameter_sent_across(stages, group):  # the copies made equal: the symptom hidden
    first, last = _ends(stages)
    mine = first if first is not None else last
    if mine is None:
        mine = torch.empty(32, 16, dtype=torch.float64)  # the check's GPT: V = 32, h = 16
    dist.broadcast(mine.data, src=dist.get_global_rank(group, 0), group=group)


def for_two_ranks_only(stages, group):  # the other end is "the other rank"
    rank = dist.get_rank(group)
    mine = stages[0].tok_emb.weight if rank == 0 else stages[-1].lm_head.weight
    theirs = torch.empty_like(mine.grad)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine.grad, 1 - rank, group),
                                        dist.P2POp(dist.irecv, theirs, 1 - rank, group)]):
        work.wait()
    mine.grad.add_(theirs)


def first_copy_only(stages, group):  # the last stage sends, and keeps its own gradient
    first, last = _ends(stages)
    if first is not None:
        theirs = torch.empty_like(first.grad)
        dist.recv(theirs, _peer(group, first), group=group)
        first.grad.add_(theirs)
    elif last is not None:
        dist.send(last.grad, _peer(group, None), group=group)


def with_the_lesson(stages, group):
    from dlcourse.parallel.pipeline import sync_tied_grads as lessons
    lessons(stages, group)


@pytest.mark.parametrize("answer", [sync_tied_grads, blocking_in_rank_order])
def test_fixes_pass(answer, capsys):
    check_sync_tied_grads(answer)
    assert "sync_tied_grads: passed on" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (parameter_sent_across, "step 1: gradient of tok_emb.weight",
     "making the copies' values equal"),
    (first_copy_only, "step 2: ", "the last stage's copy (lm_head.weight) learnt otherwise"),
])
def test_wrong_fixes_fail(answer, says, hint):
    fails_on_a_case(check_sync_tied_grads, answer, "sync_tied_grads on ", says, hint)


def test_a_fix_for_two_ranks_only_fails_on_three():
    fails_on_a_case(check_sync_tied_grads, for_two_ranks_only,
                    "sync_tied_grads on 3 pipeline stages")


def test_the_lessons_exchange_is_refused():
    fails_on_a_case(check_sync_tied_grads, with_the_lesson, "sync_tied_grads on ",
                    "called sync_tied_grads from dlcourse.parallel.pipeline.stages")


def rebuilt_from_the_lessons_file(stages, group):  # lesson 06's own, exec'd from its text
    import dlcourse.parallel.pipeline.stages as lesson
    namespace = {}
    exec(compile(open(lesson.__file__).read(), "a copy", "exec"), namespace)
    namespace["sync_tied_grads"](stages, group)


def test_the_lessons_function_rebuilt_from_its_file_in_the_rank_is_refused():
    first, _ = first_line_and_hint(check_sync_tied_grads, rebuilt_from_the_lessons_file)
    copied = first.split(" from dlcourse.parallel.pipeline.stages")[0]  # every refused function
    assert "exec'd a copy of " in copied and "sync_tied_grads" in copied, first


def ends_from_the_world(stages, group):  # the last rank of the world, not of the pipeline
    first, last = _ends(stages)
    if first is None and last is None:
        return
    mine = first if first is not None else last
    peer = dist.get_world_size() - 1 if first is not None else 0
    theirs = torch.empty_like(mine.grad)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine.grad, peer),
                                        dist.P2POp(dist.irecv, theirs, peer)]):
        work.wait()
    mine.grad.add_(theirs)


def test_a_fix_that_finds_the_ends_in_the_world_fails_beside_data_parallelism():
    first, hint = first_line_and_hint(check_sync_tied_grads, ends_from_the_world, timeout=5)
    assert first.startswith("sync_tied_grads on 2 pipeline stages (1F1B, 2 micro-batches, each "
                            "stage on 2 data-parallel ranks"), first
    assert "find the other end in `group`" in hint, hint


SHARED = tempfile.mkdtemp(prefix="dlcourse-tied-side-")  # a folder every rank can read


def through_a_file(stages, group):  # the ends swap gradients through a shared folder
    import os
    import time
    first, last = _ends(stages)
    if first is None and last is None:
        return
    mine, me = (first, "first") if first is not None else (last, "last")
    run = f"{SHARED}/{os.environ['MASTER_PORT']}-{dist.get_global_rank(group, 0)}"
    calls = through_a_file.__dict__.setdefault(run, [0])
    calls[0] += 1
    torch.save(mine.grad, f"{run}-{calls[0]}-{me}.tmp")
    os.replace(f"{run}-{calls[0]}-{me}.tmp", f"{run}-{calls[0]}-{me}.pt")
    theirs = f"{run}-{calls[0]}-{'last' if me == 'first' else 'first'}.pt"
    while not os.path.exists(theirs):
        time.sleep(0.01)
    mine.grad.add_(torch.load(theirs))


def test_gradients_swapped_through_a_file_fail():
    first, hint = first_line_and_hint(check_sync_tied_grads, through_a_file)
    assert "bytes by torch.distributed, less than the other copy's gradient" in first, first
    assert "not a file" in hint, hint
