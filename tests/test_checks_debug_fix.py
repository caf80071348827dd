"""Lesson 10, exercise 3 (`dlcourse/checks/debug/sync_sequence_parallel_grads.py`): the fix of the
catalogue's `sp_layernorm_grads`, run by lesson 04's TP + SP GPT on 2 and 3 gloo ranks and compared
with one process, gradients and parameters, over 2 AdamW steps. One coalesced all-reduce and one per
parameter (found by name) both pass; averaging instead of summing, a fix that holds for 2 ranks
only, summing every gradient (sharded ones too) and making the ranks agree by a broadcast all fail
with the hint that names the mistake; lesson 04's own all-reduce is refused."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from checking import fails_on_a_case, first_line_and_hint
from dlcourse.checks.debug import check_sync_sequence_parallel_grads


def sync_sequence_parallel_grads(model, group):  # one all-reduce of the marked gradients
    grads = [p.grad for p in model.parameters()
             if getattr(p, "sequence_partial", False) and p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(summed.view_as(g))


def by_name(model, group):  # one all-reduce per parameter, found by what it is
    for name, p in model.named_parameters():
        module = name.split(".")[-2]  # ln1, ln2, ln_f, pos_emb, proj, ...
        if module.startswith("ln") or module == "pos_emb" or name.endswith("proj.bias"):
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)


def averaged(model, group):
    for p in model.parameters():
        if getattr(p, "sequence_partial", False):
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(dist.get_world_size(group))


def for_two_ranks_only(model, group):  # both halves gathered and added: 2 ranks hard-coded
    for p in model.parameters():
        if getattr(p, "sequence_partial", False):
            halves = [torch.empty_like(p.grad), torch.empty_like(p.grad)]
            dist.all_gather(halves, p.grad, group=group)
            p.grad.copy_(halves[0] + halves[1])


def every_gradient_summed(model, group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)


def rank_zeros_broadcast(model, group):  # the ranks agree, on rank 0's partial gradients
    for p in model.parameters():
        if getattr(p, "sequence_partial", False):
            dist.broadcast(p.grad, src=dist.get_global_rank(group, 0), group=group)
            dist.broadcast(p.data, src=dist.get_global_rank(group, 0), group=group)


def with_the_lesson(model, group):
    from dlcourse.parallel.tensor.grads import all_reduce_sequence_partial_grads
    all_reduce_sequence_partial_grads(model, group)


@pytest.mark.parametrize("answer", [sync_sequence_parallel_grads, by_name])
def test_fixes_pass(answer, capsys):
    check_sync_sequence_parallel_grads(answer)
    assert "sync_sequence_parallel_grads: passed on" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (averaged, "gradient of", "do not average them"),
    (every_gradient_summed, "gradient of", "a sharded parameter"),
    (rank_zeros_broadcast, "gradient of", "saw only this rank's tokens"),
])
def test_wrong_fixes_fail(answer, says, hint):
    fails_on_a_case(check_sync_sequence_parallel_grads, answer, "sync_sequence_parallel_grads on ",
                    says, hint)


def test_a_fix_for_two_ranks_only_fails_on_three():
    fails_on_a_case(check_sync_sequence_parallel_grads, for_two_ranks_only,
                    "sync_sequence_parallel_grads on 3 ranks")


def test_the_lessons_all_reduce_is_refused():
    fails_on_a_case(check_sync_sequence_parallel_grads, with_the_lesson,
                    "sync_sequence_parallel_grads on ", "called all_reduce_sequence_partial_grads "
                    "from dlcourse.parallel.tensor.grads")


SHARED = tempfile.mkdtemp(prefix="dlcourse-sp-side-")  # a folder every rank can read


def through_a_file(model, group):  # each rank's partial gradients summed from the others' files
    import os
    import time
    grads = [p.grad for p in model.parameters() if getattr(p, "sequence_partial", False)]
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    calls = through_a_file.__dict__.setdefault("calls", [0])
    calls[0] += 1
    run = f"{SHARED}/{os.environ['MASTER_PORT']}-{calls[0]}"
    torch.save([g.clone() for g in grads], f"{run}-{rank}.tmp")
    os.replace(f"{run}-{rank}.tmp", f"{run}-{rank}.pt")
    for other in (r for r in range(size) if r != rank):
        while not os.path.exists(f"{run}-{other}.pt"):
            time.sleep(0.01)
        for g, theirs in zip(grads, torch.load(f"{run}-{other}.pt")):
            g.add_(theirs)


def test_partial_gradients_summed_through_a_file_fail():
    first, hint = first_line_and_hint(check_sync_sequence_parallel_grads, through_a_file)
    assert "bytes by torch.distributed, for partial gradients of" in first, first
    assert "not a file" in hint, hint
