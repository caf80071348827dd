"""Lesson 03's check of accumulate_step (`dlcourse/checks/data/accumulate_step.py`): the solutions
pass, and the wrong answers students write fail with a message naming the case, the rank, the
parameter, expected vs got, and a hint that says which mistake it was."""

import contextlib

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint as _first_line_and_hint
from checking import starts as _starts
from dlcourse.checks.data import check_accumulate_step
from dlcourse.parallel.data.steps import train_step

# --- exercise 5: accumulate_step ------------------------------------------------------------

def _samples(micro_batches):
    return sum(len(x) for x, _ in micro_batches)


def accumulate_step(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    n = _samples(micro_batches)
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():  # these backward passes only add into .grad
        for x, y in first:
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    (loss_fn(model(x_last), y_last) * (len(x_last) / n)).backward()  # averages the sum, once
    optimizer.step()


def accumulate_one_context_per_micro_batch(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    n = _samples(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    optimizer.step()


def accumulate_without_no_sync(model, optimizer, micro_batches, loss_fn):  # syncs every time
    optimizer.zero_grad()
    n = _samples(micro_batches)
    for x, y in micro_batches:
        (loss_fn(model(x), y) * (len(x) / n)).backward()
    optimizer.step()


def accumulate_all_in_no_sync(model, optimizer, micro_batches, loss_fn):  # never syncs
    optimizer.zero_grad()
    n = _samples(micro_batches)
    with model.no_sync():
        for x, y in micro_batches:
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    optimizer.step()


def accumulate_last_forward_in_no_sync(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    n = _samples(micro_batches)
    with model.no_sync():
        losses = [loss_fn(model(x), y) * (len(x) / n) for x, y in micro_batches]
        for loss in losses[:-1]:
            loss.backward()
    losses[-1].backward()  # outside no_sync, but its forward ran inside
    optimizer.step()


def accumulate_unscaled(model, optimizer, micro_batches, loss_fn):  # the sum of the means
    optimizer.zero_grad()
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            loss_fn(model(x), y).backward()
    loss_fn(model(x_last), y_last).backward()
    optimizer.step()


def accumulate_per_micro_batch_count(model, optimizer, micro_batches, loss_fn):  # 1/M each
    optimizer.zero_grad()
    M = len(micro_batches)
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            (loss_fn(model(x), y) / M).backward()
    (loss_fn(model(x_last), y_last) / M).backward()
    optimizer.step()


def accumulate_by_the_global_batch(model, optimizer, micro_batches, loss_fn):  # / (n x W)
    optimizer.zero_grad()
    n = _samples(micro_batches) * dist.get_world_size()
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    (loss_fn(model(x_last), y_last) * (len(x_last) / n)).backward()
    optimizer.step()


def accumulate_zeroes_every_micro_batch(model, optimizer, micro_batches, loss_fn):
    n = _samples(micro_batches)
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            optimizer.zero_grad()
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    optimizer.zero_grad()
    (loss_fn(model(x_last), y_last) * (len(x_last) / n)).backward()
    optimizer.step()


def accumulate_without_zero_grad(model, optimizer, micro_batches, loss_fn):
    n = _samples(micro_batches)
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    (loss_fn(model(x_last), y_last) * (len(x_last) / n)).backward()
    optimizer.step()


def accumulate_in_one_forward(model, optimizer, micro_batches, loss_fn):  # no micro-batches
    optimizer.zero_grad()
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss_fn(model(x), y).backward()
    optimizer.step()


def accumulate_then_average_by_hand(model, optimizer, micro_batches, loss_fn):  # twice synced
    optimizer.zero_grad()
    n = _samples(micro_batches)
    *first, (x_last, y_last) = micro_batches
    with model.no_sync():
        for x, y in first:
            (loss_fn(model(x), y) * (len(x) / n)).backward()
    (loss_fn(model(x_last), y_last) * (len(x_last) / n)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()


def accumulate_with_the_library(model, optimizer, micro_batches, loss_fn):
    train_step(model, optimizer, micro_batches, loss_fn)


ACC_MLP = ("accumulate_step on 4 ranks, MLP in DataParallel, micro-batches of 3, 3, 2 samples on "
           "each rank: rank 0 ")


@pytest.mark.parametrize("step", [accumulate_step, accumulate_one_context_per_micro_batch])
def test_accumulate_step_solutions_pass(step, capsys):
    check_accumulate_step(step)
    assert "accumulate_step: passed on 4 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (accumulate_without_no_sync, ACC_MLP + "synchronised the gradients in step 1 after "
                                           "micro-batch 1 of 3, before the last",
     "run every micro-batch but the last (its forward and backward) inside `with "
     "model.no_sync():`"),
    (accumulate_all_in_no_sync, ACC_MLP + "made no all-reduce in step 1: the gradients were "
                                          "never averaged",
     "run the last micro-batch's forward and backward outside no_sync()"),
    (accumulate_last_forward_in_no_sync, ACC_MLP + "made no all-reduce in step 1",
     "the wrapper decides at forward time, as DDP does, whether that backward synchronises"),
    (accumulate_unscaled, ACC_MLP + "after step 1: parameter",
     "your step is the sum of the 3 micro-batches' gradients: each micro-batch's loss is a mean "
     "over its own samples; weigh it by its share, x.size(0) / 8 samples on this rank"),
    (accumulate_per_micro_batch_count, ACC_MLP + "after step 1: parameter",
     "your step weighs the 3 micro-batches equally, but they hold 3, 3, 2 samples: weigh each "
     "micro-batch's loss by x.size(0) / 8, not 1 / 3"),
    (accumulate_by_the_global_batch, ACC_MLP + "after step 1: parameter",
     "your step is 1/4 of the whole batch's: the wrapper already averages over the ranks"),
    (accumulate_zeroes_every_micro_batch, ACC_MLP + "after step 1: parameter",
     "only the last micro-batch's gradient reached the step: zero the gradients once, before "
     "the first micro-batch, not inside the loop"),
    (accumulate_without_zero_grad, ACC_MLP + "after step 2: parameter",
     "step 2 also used step 1's gradient, still in p.grad"),
    (accumulate_in_one_forward, ACC_MLP + "called loss_fn 1 time in step 1 for 3 micro-batches",
     "one forward, loss and backward per micro-batch"),
    (accumulate_then_average_by_hand, ACC_MLP + "made 9 all-reduces in step 1, expected 3: one "
                                                "per bucket, once per step",
     "do not all-reduce them yourself as well"),
    (accumulate_with_the_library, ACC_MLP.replace("rank 0 ", "rank ?") + " called train_step "
                                                                        "from dlcourse.parallel."
                                                                        "data.steps, which this "
                                                                        "exercise does "
                                                                        "not allow", ""),
])
def test_accumulate_step_rejects_plausible_wrong_answers(wrong, says, hint):
    first, got_hint = _first_line_and_hint(check_accumulate_step, wrong)
    assert _starts(first, says)
    assert hint in got_hint
