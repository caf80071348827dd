"""Lesson 05's check of gather_and_free (`dlcourse/checks/zero/gather_and_free.py`): the solutions
and correct answers written other ways pass; the wrong answers students write fail with a message
naming the case, the rank and a hint that says which mistake it was. Every run draws new cases, so
each wrong answer here fails on whatever is drawn."""

import re

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from checking import first_line_and_hint, starts
from dlcourse.checks.zero import check_gather_and_free


# --- exercise 3: gather_and_free --------------------------------------------------------------

def _storage(full):
    return full.untyped_storage()


def _hooks(unit, gather, free, forward_free=True, backward_gather=True, backward_free=True):
    def call(action):
        def hook(*_):
            action()  # a hook that returns something replaces the output: return None
        return hook

    unit.register_forward_pre_hook(call(gather))
    if forward_free:
        unit.register_forward_hook(call(free))
    if backward_gather:
        unit.register_full_backward_pre_hook(call(gather))
    if backward_free:
        unit.register_full_backward_hook(call(free))


def _free(full):
    def free():
        _storage(full).resize_(0)
    return free


def _gatherer(full, shard, group, communicate=True):
    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        if communicate:
            dist.all_gather_single(full, shard, group=group)
    return gather


def gather_and_free(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full))


def gather_and_free_tensor_hooks(unit, full, shard, group):
    """Gathers a list into full's chunks, and uses hooks on the unit's output and input."""
    def gather(*_):
        _storage(full).resize_(full.numel() * full.element_size())
        dist.all_gather(list(full.chunk(dist.get_world_size(group))), shard, group=group)

    def free(*_):
        _storage(full).resize_(0)

    def before(module, args):
        gather()
        args[0].register_hook(free)  # its gradient is the unit's last: backward is done

    def after(module, args, output):
        free()
        output.register_hook(gather)  # the unit's backward starts from this gradient

    unit.register_forward_pre_hook(before)
    unit.register_forward_hook(after)


def gather_and_free_never_frees(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), lambda: None)


def gather_and_free_keeps_through_forward(unit, full, shard, group):  # frees after backward only
    _hooks(unit, _gatherer(full, shard, group), _free(full),
           forward_free=False, backward_gather=False)


def gather_and_free_keeps_after_backward(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full), backward_free=False)


def gather_and_free_no_gather_before_backward(unit, full, shard, group):
    _hooks(unit, _gatherer(full, shard, group), _free(full),
           backward_gather=False)


def gather_and_free_allocates_without_gathering(unit, full, shard, group):
    allocate = _gatherer(full, shard, group, communicate=False)
    _hooks(unit, _gatherer(full, shard, group), _free(full), backward_gather=False)
    unit.register_full_backward_pre_hook(lambda *_: allocate())


def gather_and_free_reversed_ranks(unit, full, shard, group):
    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        dist.all_gather(list(reversed(full.chunk(dist.get_world_size(group)))), shard,
                        group=group)
    _hooks(unit, gather, _free(full))


def gather_and_free_from_a_hidden_copy(unit, full, shard, group):
    """Gathers once, when installed, keeps a full copy, and makes a 1-element all-reduce before
    each pass to look as if it gathered: issue 28's escape."""
    _gatherer(full, shard, group)()
    hidden, token = full.clone(), torch.zeros(1, dtype=full.dtype)
    _free(full)()

    def gather():
        _storage(full).resize_(full.numel() * full.element_size())
        full.data.copy_(hidden)  # as a collective writes: no autograd version bump
        dist.all_reduce(token, group=group)

    _hooks(unit, gather, _free(full))


def gather_and_free_with_fsdp(unit, full, shard, group):
    fully_shard(unit)


@pytest.mark.parametrize("answer", [gather_and_free, gather_and_free_tensor_hooks])
def test_gather_and_free_passes_correct_answers(answer, capsys):
    check_gather_and_free(answer)
    assert "gather_and_free: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (gather_and_free_never_frees, "rank ? still holds", "forward hook"),
    (gather_and_free_keeps_through_forward, "rank ? still holds", "forward hook"),
    (gather_and_free_keeps_after_backward, "rank ? still holds", "once the unit's backward"),
    (gather_and_free_no_gather_before_backward, "rank ? raised RuntimeError",
     "storage of size 0"),
    (gather_and_free_allocates_without_gathering, "rank ? made no collective in backward",
     "gather again"),
    (gather_and_free_reversed_ranks, "rank ? returned wrong values", "rank order"),
    (gather_and_free_from_a_hidden_copy, "rank ? made all_reduce of 8 bytes in forward 1: a "
                                         "correct answer gathers",
     "gather before the unit's forward"),
    (gather_and_free_with_fsdp, "rank ? called torch's fully_shard", ""),
])
def test_gather_and_free_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_gather_and_free, answer)
    assert re.match(r"gather_and_free on \d ranks, ", first), first
    assert starts(first.split(": ", 1)[1], says), first
    assert hint in got_hint
