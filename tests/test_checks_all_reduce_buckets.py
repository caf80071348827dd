"""Lesson 03's check of all_reduce_buckets, and what every lesson-03 check does with an unwritten,
misused or hanging function (`dlcourse/checks/data/all_reduce_buckets.py`): the solutions pass, and
the wrong answers students write fail with a message naming the case, the rank, the parameter,
expected vs got, and a hint that says which mistake it was."""

import pytest
import torch
import torch.distributed as dist

from checking import HANG_TIMEOUT_S
from checking import first_line_and_hint as _first_line_and_hint
from checking import starts as _starts
from dlcourse.checks.core import CheckFailed
from dlcourse.checks.data import (
    check_accumulate_step,
    check_all_reduce_buckets,
    check_broadcast_parameters,
    check_data_parallel_step,
    check_make_buckets,
)
from dlcourse.parallel.data.buckets import all_reduce_buckets as library_all_reduce_buckets

# --- exercise 4: all_reduce_buckets ---------------------------------------------------------

def _flat_gradients(params, dtype=None):
    return torch.cat([torch.zeros(p.numel(), dtype=dtype or p.dtype) if p.grad is None
                      else p.grad.reshape(-1).to(dtype or p.dtype) for p in params])


def all_reduce_buckets(buckets, group):
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = _flat_gradients(params)  # zeros for a parameter without a gradient
        dist.all_reduce(flat, group=group)
        flat /= world_size
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            if p.grad is not None:
                p.grad.copy_(piece.view_as(p))


def all_reduce_each_parameter(buckets, group):  # the buckets ignored
    for params in buckets:
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= dist.get_world_size(group)


def all_reduce_everything_at_once(buckets, group):  # one buffer for the whole model
    world_size = dist.get_world_size(group)
    params = [p for bucket in buckets for p in bucket]
    flat = _flat_gradients(params)
    dist.all_reduce(flat, group=group)
    for p, piece in zip(params, (flat / world_size).split([p.numel() for p in params])):
        if p.grad is not None:
            p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_summed(buckets, group):  # no division by the world size
    for params in buckets:
        flat = _flat_gradients(params)
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            if p.grad is not None:
                p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_never_unpacked(buckets, group):  # rebinds a name, .grad unchanged
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = _flat_gradients(params)
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            grad = p.grad
            grad = piece.view_as(p) / world_size  # noqa: F841 (the mistake)


def all_reduce_buckets_unpacked_backwards(buckets, group):  # unpacks in the other order
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = _flat_gradients(params)
        dist.all_reduce(flat, group=group)
        pieces = (flat / world_size).split([p.numel() for p in params])
        for p, piece in zip(reversed(params), pieces):
            if p.grad is not None:
                p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_of_parameters(buckets, group):  # packs p, not p.grad
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, (flat / world_size).split([p.numel() for p in params])):
            if p.grad is not None:
                p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_in_float32(buckets, group):  # torch.zeros(n): a float32 buffer
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = _flat_gradients(params, dtype=torch.float32)
        dist.all_reduce(flat, group=group)
        flat /= world_size
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            if p.grad is not None:
                p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_grad_none_crashes(buckets, group):  # assumes every .grad exists
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, (flat / world_size).split([p.numel() for p in params])):
            p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_skips_missing(buckets, group):  # packs only the gradients it has
    world_size = dist.get_world_size(group)
    for params in buckets:
        have = [p for p in params if p.grad is not None]
        flat = _flat_gradients(have)
        dist.all_reduce(flat, group=group)
        for p, piece in zip(have, (flat / world_size).split([p.numel() for p in have])):
            p.grad.copy_(piece.view_as(p))


def all_reduce_buckets_fills_every_grad(buckets, group):  # gives unused parameters zeros
    world_size = dist.get_world_size(group)
    for params in buckets:
        flat = _flat_gradients(params)
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, (flat / world_size).split([p.numel() for p in params])):
            p.grad = piece.view_as(p).clone()


def all_reduce_buckets_with_the_library(buckets, group):
    library_all_reduce_buckets(buckets, group)


REDUCE_GPT = ("all_reduce_buckets on 4 ranks, tied GPT in float32, 4 buckets (1,120, 1,152, "
              "1,216, 864 bytes): rank 0 ")
REDUCE_IDLE = ("all_reduce_buckets on 3 ranks, MLP with idle parameters in float32, 3 buckets "
               "(128, 224, 168 bytes): rank 0 ")
REDUCE_F64 = "all_reduce_buckets on 2 ranks, MLP in float64, 1 bucket (976 bytes): rank 0 "


def test_all_reduce_buckets_solution_passes(capsys):
    check_all_reduce_buckets(all_reduce_buckets)
    assert "all_reduce_buckets: passed on 5 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (all_reduce_each_parameter, REDUCE_GPT + "made 16 all-reduces for 4 buckets, one per "
                                             "parameter: the point of a bucket is one call for "
                                             "many gradients", "dist.all_reduce it once"),
    (all_reduce_everything_at_once, REDUCE_GPT + "made 1 all-reduce for 4 buckets",
     "for each bucket"),
    (all_reduce_buckets_summed, REDUCE_GPT + "left parameter tok_emb.weight a wrong .grad: "
                                             "element",
     "it holds the sum over the ranks: divide the all-reduced buffer by the world size"),
    (all_reduce_buckets_never_unpacked, REDUCE_GPT + "left parameter tok_emb.weight a wrong .grad",
     "it still holds this rank's own gradient: copy the all-reduced buffer back into p.grad"),
    (all_reduce_buckets_unpacked_backwards, REDUCE_GPT.replace("rank 0 ", "rank ?") + " raised "
                                                                             "RuntimeError",
     "in the order you packed"),
    (all_reduce_buckets_of_parameters, REDUCE_GPT + "left parameter tok_emb.weight a wrong .grad",
     "it holds the parameter's values: pack p.grad, not p"),
    (all_reduce_buckets_in_float32, REDUCE_F64 + "all-reduced 488 bytes; the buckets hold 976 "
                                                 "bytes of gradients",
     "in the gradients' dtype (torch.cat keeps it; torch.zeros(n) alone is float32)"),
    (all_reduce_buckets_grad_none_crashes, REDUCE_IDLE.replace("rank 0 ", "rank ?") + " raised "
                                                                            "AttributeError",
     "zeros for a parameter whose .grad is None"),
    (all_reduce_buckets_skips_missing, REDUCE_IDLE + "all-reduced 96, 224, 168 bytes; the "
                                                     "buckets hold 128, 224, 168 bytes",
     "zeros for one whose .grad is None, so that every rank's buffer has the same layout"),
    (all_reduce_buckets_fills_every_grad, REDUCE_IDLE + "gave parameter unused.weight a gradient, "
                                                        "but no rank computed one",
     "leave a .grad that is None as it is"),
    (all_reduce_buckets_with_the_library, REDUCE_GPT.replace("rank 0 ", "rank ?") + " called "
                                                                             "all_reduce_buckets "
                                                                             "from "
                                                                             "dlcourse.parallel",
     ""),
])
def test_all_reduce_buckets_rejects_plausible_wrong_answers(wrong, says, hint):
    first, got_hint = _first_line_and_hint(check_all_reduce_buckets, wrong)
    assert _starts(first, says)
    assert hint in got_hint

# --- what every check does with an unwritten, misused or hanging function ------------------

def not_written(*args):
    raise NotImplementedError("Hint: one all-reduce per bucket")


CHECKS = [(check_broadcast_parameters, "broadcast_parameters"),
          (check_data_parallel_step, "data_parallel_step"), (check_make_buckets, "make_buckets"),
          (check_all_reduce_buckets, "all_reduce_buckets"),
          (check_accumulate_step, "accumulate_step")]


@pytest.mark.parametrize("check, name", CHECKS)
def test_an_unwritten_exercise_says_so_with_its_hint(check, name):
    with pytest.raises(CheckFailed, match=f"^{name} is not written yet: .* Hint: one all-reduce"):
        check(not_written)


@pytest.mark.parametrize("check, name", CHECKS)
def test_a_result_instead_of_the_function_is_explained(check, name):
    with pytest.raises(CheckFailed, match=f"the check for {name} needs your function itself"):
        check(torch.ones(2))


def all_reduce_buckets_on_rank_0_only(buckets, group):  # the other ranks never join
    if dist.get_rank() == 0:
        all_reduce_buckets(buckets, group)


def test_a_collective_not_every_rank_calls_fails_in_seconds_saying_it_hung():
    first, _ = _first_line_and_hint(check_all_reduce_buckets, all_reduce_buckets_on_rank_0_only,
                                    timeout=HANG_TIMEOUT_S)
    assert first.startswith(REDUCE_GPT.removesuffix("rank 0 ")
                            + f"did not finish within {HANG_TIMEOUT_S} s on 4 ranks")
    assert "a collective that not every rank calls" in first
