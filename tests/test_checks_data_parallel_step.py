"""Lesson 03's check of broadcast_parameters and data_parallel_step
(`dlcourse/checks/data/broadcast_parameters.py`,
`data_parallel_step.py`): the solutions pass, and the wrong answers students write
fail with a message naming the case, the rank, the parameter, expected vs got, and a hint that
says which mistake it was."""

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint as _first_line_and_hint
from checking import starts as _starts
from dlcourse.checks.data import (
    check_broadcast_parameters,
    check_data_parallel_step,
)
from dlcourse.parallel.data.steps import average_gradients
from dlcourse.parallel.data.steps import broadcast_parameters as library_broadcast

# --- exercises 1 and 2: broadcast_parameters, data_parallel_step --------------------------------

def broadcast_parameters(model, group):
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=dist.get_global_rank(group, 0), group=group)


def _global_samples(x, group):
    total = torch.tensor([float(len(x))])
    dist.all_reduce(total, group=group)  # N: the samples on all ranks
    return total.item()


def data_parallel_step(model, optimizer, x, y, loss_fn, group):
    optimizer.zero_grad()
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)  # the sum of n_r / N g_r: the whole batch's
    optimizer.step()


def step_scaled_then_averaged(model, optimizer, x, y, loss_fn, group):  # the lesson's way
    optimizer.zero_grad()
    world_size = dist.get_world_size(group)
    (loss_fn(model(x), y) * (world_size * len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= world_size
    optimizer.step()


def broadcast_nothing(model, group):  # ranks start from different weights
    pass


def broadcast_from_the_last_rank(model, group):
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p, src=dist.get_world_size(group) - 1, group=group)


def step_summed(model, optimizer, x, y, loss_fn, group):  # forgot to divide by the world size
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    optimizer.step()


def step_local_average(model, optimizer, x, y, loss_fn, group):  # right for equal shards only
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)
    optimizer.step()


def step_assumes_equal_shards(model, optimizer, x, y, loss_fn, group):  # N = len(x) x W
    optimizer.zero_grad()
    n_global = len(x) * dist.get_world_size(group)
    (loss_fn(model(x), y) * (len(x) / n_global)).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    optimizer.step()


def step_divides_twice(model, optimizer, x, y, loss_fn, group):  # weighted by n_r / N, then / W
    optimizer.zero_grad()
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= dist.get_world_size(group)
    optimizer.step()


def step_averages_parameters(model, optimizer, x, y, loss_fn, group):  # model averaging
    optimizer.zero_grad()
    world_size = dist.get_world_size(group)
    (loss_fn(model(x), y) * (world_size * len(x) / _global_samples(x, group))).backward()
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p, group=group)
            p /= world_size


def step_averages_parameters_flat(model, optimizer, x, y, loss_fn, group):  # ... in one buffer
    optimizer.zero_grad()
    world_size = dist.get_world_size(group)
    (loss_fn(model(x), y) * (world_size * len(x) / _global_samples(x, group))).backward()
    optimizer.step()
    with torch.no_grad():
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([p.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            p.copy_(piece.view_as(p) / world_size)


def step_without_zero_grad(model, optimizer, x, y, loss_fn, group):
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    optimizer.step()


def step_before_the_all_reduce(model, optimizer, x, y, loss_fn, group):
    optimizer.zero_grad()
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    optimizer.step()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def step_reduces_a_copy(model, optimizer, x, y, loss_fn, group):  # the sum lands in a clone
    optimizer.zero_grad()
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        if p.grad is not None:
            grad = p.grad.clone()
            dist.all_reduce(grad, group=group)
    optimizer.step()


def step_all_reduces_none(model, optimizer, x, y, loss_fn, group):  # every p, even without .grad
    optimizer.zero_grad()
    (loss_fn(model(x), y) * (len(x) / _global_samples(x, group))).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)
    optimizer.step()


def step_with_the_library(model, optimizer, x, y, loss_fn, group):
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    average_gradients(model, group)
    optimizer.step()


def broadcast_with_the_library(model, group):
    library_broadcast(model, group)


def broadcast_trainable_only(model, group):  # a frozen parameter is a parameter too
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                dist.broadcast(p, src=0, group=group)


def broadcast_a_copy(model, group):  # the copy gets rank 0's values, the parameter does not
    for p in model.parameters():
        dist.broadcast(p.detach().clone(), src=0, group=group)


BROADCAST_GPT = "broadcast_parameters on 4 ranks, tied GPT, each rank from its own seed: "


def test_broadcast_parameters_solution_passes(capsys):
    check_broadcast_parameters(broadcast_parameters)
    assert "broadcast_parameters: passed on 4 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says", [
    (broadcast_nothing, BROADCAST_GPT + "rank 1 kept its own initial value of tok_emb.weight: "
                                        "nothing was copied into it"),
    (broadcast_a_copy, BROADCAST_GPT + "rank 1 kept its own initial value of tok_emb.weight: "
                                       "nothing was copied into it"),
    (broadcast_from_the_last_rank, BROADCAST_GPT + "rank 0 holds rank 3's initial value of "
                                                   "tok_emb.weight, not rank 0's"),
    (broadcast_trainable_only, "broadcast_parameters on 3 ranks, MLP with idle parameters, each "
                               "rank from its own seed: rank 1 kept its own initial value of "
                               "frozen: nothing was copied into it"),
])
def test_broadcast_parameters_rejects_plausible_wrong_answers(wrong, says):
    first, hint = _first_line_and_hint(check_broadcast_parameters, wrong)
    assert first == says
    assert "copy the group's first rank's value into every parameter (frozen ones" in hint


STEP_4 = "data_parallel_step on 4 ranks, MLP, 12 samples in shards of 3, 3, 3, 3, SGD: "
STEP_3 = "data_parallel_step on 3 ranks, tied GPT, 7 samples in shards of 1, 4, 2, SGD: "


@pytest.mark.parametrize("step", [data_parallel_step, step_scaled_then_averaged])
def test_data_parallel_step_solutions_pass(step, capsys):
    check_data_parallel_step(step)
    assert "data_parallel_step: passed on 5 cases" in capsys.readouterr().out


@pytest.mark.parametrize("step, says, hint", [
    (step_summed, STEP_4 + "rank 0 after step 1: parameter 4.bias element",
     "your step is 4 times the whole batch's: the all-reduce sums the ranks' gradients; divide "
     "by the world size"),
    # which weight is farthest from one process's depends on the data, drawn afresh each run
    (step_local_average, STEP_3 + "rank 0 after step 1: parameter ",
     "your step weighs the 3 ranks equally, but they hold 1, 4, 2 of the 7 samples"),
    (step_assumes_equal_shards, STEP_3 + "rank 0 after step 1: parameter ",
     "with N from an all-reduce of the ranks' len(x), not a count assumed equal"),
    (step_divides_twice, STEP_4 + "rank 0 after step 1: parameter 4.bias",
     "your step is 1/4 of the whole batch's: with each loss weighted by n_r / N the all-reduced "
     "sum is already the whole batch's gradient"),
    (step_averages_parameters,
     STEP_4 + "rank 0 all-reduced the values of parameter 0.weight (the parameter itself, or "
              "p.data), not its gradient",
     "average the gradients (p.grad) between loss.backward() and optimizer.step()"),
    (step_averages_parameters_flat,
     "data_parallel_step on 2 ranks, MLP, 4 samples in shards of 2, 2, AdamW: rank 0 after step "
     "1: parameter ",
     "the SGD cases passed but AdamW's did not. AdamW's step is not linear in the gradient"),
    (step_without_zero_grad, STEP_4 + "rank 0 after step 2: parameter",
     "step 2 also used step 1's gradient, still in p.grad: clear the gradients at the start of "
     "each step (optimizer.zero_grad())"),
    (step_before_the_all_reduce, STEP_4 + "rank 0 after step 1: parameter",
     "rank 0 stepped with its own shard's gradient alone: the all-reduce did not reach p.grad "
     "before optimizer.step()"),
    (step_reduces_a_copy, STEP_4 + "rank 0 after step 1: parameter",
     "rank 0 stepped with its own shard's gradient alone"),
    (step_all_reduces_none,
     "data_parallel_step on 2 ranks, MLP with idle parameters, 8 samples in shards of 5, 3, SGD: "
     "rank ? raised TypeError", "all-reduce each p.grad (skip one that is None)"),
])
def test_data_parallel_step_rejects_plausible_wrong_answers(step, says, hint):
    first, got_hint = _first_line_and_hint(check_data_parallel_step, step)
    assert _starts(first, says)
    assert hint in got_hint


@pytest.mark.parametrize("check, wrong, where, name", [
    (check_data_parallel_step, step_with_the_library, STEP_4, "average_gradients"),
    (check_broadcast_parameters, broadcast_with_the_library, BROADCAST_GPT,
     "broadcast_parameters"),
])
def test_the_lessons_functions_are_refused(check, wrong, where, name):
    first, _ = _first_line_and_hint(check, wrong)
    assert _starts(first, where + f"rank ? called {name} from dlcourse.parallel.data.steps, "
                                  "which this exercise does not allow: it is the lesson's "
                                  "answer to this exercise; write it yourself")
