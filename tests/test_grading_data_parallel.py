"""Lesson 03's checks (`dlcourse/checks/data_parallel.py`): the solutions pass, and the wrong
answers students write fail with a message naming the case, the rank, the parameter, expected
vs got, and a hint that says which mistake it was."""

import contextlib
import re

import pytest
import torch
import torch.distributed as dist

from dlcourse.checks.core import CheckFailed
from dlcourse.checks.data_parallel import (
    check_accumulate_step, check_all_reduce_buckets, check_broadcast_parameters,
    check_data_parallel_step, check_make_buckets,
)
from dlcourse.parallel.data.steps import average_gradients, train_step
from dlcourse.parallel.data.steps import broadcast_parameters as library_broadcast
from dlcourse.parallel.data.buckets import all_reduce_buckets as library_all_reduce_buckets
from dlcourse.parallel.data.buckets import make_buckets as library_make_buckets

HANG_TIMEOUT_S = 2


def _first_line_and_hint(check, *fns, **kwargs):
    with pytest.raises(CheckFailed) as failed:
        check(*fns, **kwargs)
    message = str(failed.value)
    first, _, rest = message.partition("\n")
    return first, rest.partition("Hint: ")[2]


def _starts(first, says):
    """first starts with says, where "rank ?" in says stands for any rank: when every rank
    fails alike, the message names the first to fail, whichever that is."""
    pattern = re.escape(says).replace(re.escape("rank ?"), r"rank \d")
    return re.match(pattern, first) is not None


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
    assert "broadcast_parameters: passed on 3 cases" in capsys.readouterr().out


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
    assert "copy rank 0's value into every parameter (frozen ones too) on every rank" in hint


STEP_4 = "data_parallel_step on 4 ranks, MLP, 12 samples in shards of 3, 3, 3, 3, SGD: "
STEP_3 = "data_parallel_step on 3 ranks, tied GPT, 7 samples in shards of 1, 4, 2, SGD: "


@pytest.mark.parametrize("step", [data_parallel_step, step_scaled_then_averaged])
def test_data_parallel_step_solutions_pass(step, capsys):
    check_data_parallel_step(step)
    assert "data_parallel_step: passed on 4 cases" in capsys.readouterr().out


@pytest.mark.parametrize("step, says, hint", [
    (step_summed, STEP_4 + "rank 0 after step 1: parameter 4.bias element",
     "your step is 4 times the whole batch's: the all-reduce sums the ranks' gradients; divide "
     "by the world size"),
    (step_local_average, STEP_3 + "rank 0 after step 1: parameter blocks.0.attn.proj.bias",
     "your step weighs the 3 ranks equally, but they hold 1, 4, 2 of the 7 samples"),
    (step_assumes_equal_shards, STEP_3 + "rank 0 after step 1: parameter blocks.0.attn.proj.bias",
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
     "1: parameter 4.bias element [0] is 0, one process on the whole batch has 0.001",
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
    assert _starts(first, where + f"rank ? called {name} from dlcourse.parallel, which this "
                                  "exercise does not allow: it is the lesson's answer to this "
                                  "exercise; write it yourself")


# --- exercise 3: make_buckets ---------------------------------------------------------------

def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _greedy(params, close):
    """Pack params in order; close(bytes so far) says when a bucket is full."""
    buckets, current, size = [], [], 0
    for p in params:
        current.append(p)
        size += p.numel() * p.element_size()
        if close(size):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def make_buckets(model, bucket_cap_mb):
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(_trainable(model)), lambda size: size >= cap)


def make_buckets_forward_order(model, bucket_cap_mb):
    cap = bucket_cap_mb * 2**20
    return _greedy(_trainable(model), lambda size: size >= cap)


def make_buckets_strictly_over(model, bucket_cap_mb):  # > where the lesson closes at >=
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(_trainable(model)), lambda size: size > cap)


def make_buckets_in_megabytes(model, bucket_cap_mb):  # 10**6 bytes, not 2**20
    cap = bucket_cap_mb * 10**6
    return _greedy(reversed(_trainable(model)), lambda size: size >= cap)


def make_buckets_four_bytes_each(model, bucket_cap_mb):  # assumes float32 everywhere
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        current.append(p)
        size += 4 * p.numel()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def make_buckets_at_most_the_cap(model, bucket_cap_mb):  # never over the cap: closes early
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    return buckets + ([current] if current else [])


def make_buckets_drops_the_last(model, bucket_cap_mb):  # the last, partly full bucket is lost
    cap = bucket_cap_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(_trainable(model)):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets


def make_buckets_tied_twice(model, bucket_cap_mb):  # every name, the tied matrix twice
    cap = bucket_cap_mb * 2**20
    params = [p for _, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    return _greedy(reversed(params), lambda size: size >= cap)


def make_buckets_with_frozen(model, bucket_cap_mb):  # requires_grad ignored
    cap = bucket_cap_mb * 2**20
    return _greedy(reversed(list(model.parameters())), lambda size: size >= cap)


def make_buckets_one_per_parameter(model, bucket_cap_mb):  # the cap ignored
    return [[p] for p in reversed(_trainable(model))]


def make_buckets_of_names(model, bucket_cap_mb):  # names instead of the parameters
    names = {p: n for n, p in model.named_parameters()}
    return [[names[p] for p in bucket] for bucket in make_buckets(model, bucket_cap_mb)]


def make_buckets_with_the_library(model, bucket_cap_mb):
    return [bucket.params for bucket in library_make_buckets(model, bucket_cap_mb)]


GPT_PLAN = ("make_buckets(model, bucket_cap_mb=0.001) of the tied GPT in float32, a cap of "
            "1,048.6 bytes: ")
FULL_PLAN = ("make_buckets(model, bucket_cap_mb=0.000118256) of the MLP in float32, a cap of "
             "124.0 bytes: ")
F64_PLAN = ("make_buckets(model, bucket_cap_mb=0.00019) of the MLP in float64, a cap of 199.2 "
            "bytes: ")


def test_make_buckets_solution_passes(capsys):
    check_make_buckets(make_buckets)
    assert "make_buckets: passed on 5 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (make_buckets_forward_order, GPT_PLAN + "the parameters are in another order: number 0 of "
                                            "the plan is tok_emb.weight, expected ln_f.bias",
     "from the last to the first of model.parameters()"),
    (make_buckets_strictly_over, FULL_PLAN + "bucket 0 goes on past the cap: it held 124 bytes, "
                                             "at least the cap of 124.0, once it had 2.bias, "
                                             "but you close it later, at 320 bytes",
     "124 bytes is exactly the cap, and a bucket that reaches it is full (>=, not >)"),
    (make_buckets_in_megabytes, F64_PLAN + "bucket 0 closes at 192 bytes after 4.weight, below "
                                           "the cap of 199.2 bytes",
     "bucket_cap_mb is in MiB, 2**20 bytes (not 10**6)"),
    (make_buckets_four_bytes_each, F64_PLAN + "bucket 0 goes on past the cap: it held 248 bytes",
     "p.numel() * p.element_size() each"),
    (make_buckets_at_most_the_cap, GPT_PLAN + "bucket 0 closes at 96 bytes after "
                                              "blocks.0.mlp.proj.bias, below the cap",
     "keep adding parameters until the bucket holds at least the cap"),
    (make_buckets_drops_the_last, GPT_PLAN + "parameter blocks.0.ln1.bias is in no bucket (nor "
                                             "are 3 more)",
     "after the loop, add the last bucket even if it holds less than the cap"),
    (make_buckets_tied_twice, GPT_PLAN + "the plan holds tok_emb.weight 2 times (lm_head.weight "
                                         "is tok_emb.weight: one Parameter used twice",
     "not from every module or named_parameters(remove_duplicate=False)"),
    (make_buckets_with_frozen, "make_buckets(model, bucket_cap_mb=0) of the MLP with idle "
                               "parameters in float32, a cap of 0.0 bytes: the plan holds frozen, "
                               "which has requires_grad=False",
     "leave out every p without p.requires_grad"),
    (make_buckets_one_per_parameter, GPT_PLAN + "bucket 0 closes at 32 bytes after ln_f.bias, "
                                                "below the cap of 1,048.6 bytes",
     "keep adding parameters until the bucket holds at least the cap"),
    (make_buckets_of_names, GPT_PLAN + "bucket 0 holds a str, which is not one of the model's "
                                       "parameters",
     "put the Parameter objects themselves in the buckets"),
    (make_buckets_with_the_library, GPT_PLAN + "called make_buckets from dlcourse.parallel, "
                                               "which this exercise does not allow", ""),
])
def test_make_buckets_rejects_plausible_wrong_answers(wrong, says, hint):
    first, got_hint = _first_line_and_hint(check_make_buckets, wrong)
    assert _starts(first, says)
    assert hint in got_hint


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
    assert "all_reduce_buckets: passed on 3 cases" in capsys.readouterr().out


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
    assert "accumulate_step: passed on 3 cases" in capsys.readouterr().out


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
                                                                        "from dlcourse.parallel, "
                                                                        "which this exercise does "
                                                                        "not allow", ""),
])
def test_accumulate_step_rejects_plausible_wrong_answers(wrong, says, hint):
    first, got_hint = _first_line_and_hint(check_accumulate_step, wrong)
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
