"""Lesson 04's checks draw their cases afresh (a seed replays them), and refuse the lesson's
tensor-parallel code however it is reached."""

import random
import re
import types
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dlcourse.checks.tensor.answers as tensor_library
import dlcourse.parallel.tensor.comm as tp_comm
from checking import first_line_and_hint, first_line_and_message
from dlcourse.checks.core.refuse import ForbiddenCall
from dlcourse.checks.tensor import check_column_parallel_linear, check_row_parallel_linear
from test_checks_column_parallel_linear import column_parallel_linear
from test_checks_row_parallel_linear import row_bias_on_every_rank


# --- cases drawn afresh; the library refused however it is reached -----------------------------

def test_cases_are_drawn_afresh_and_a_seed_replays_them():
    failures = [first_line_and_message(check_row_parallel_linear, row_bias_on_every_rank)
                for _ in range(2)]
    seeds = [re.search(r"cases drawn from seed (\d+)", message)[1] for _, message in failures]
    assert seeds[0] != seeds[1]
    again, message = first_line_and_message(check_row_parallel_linear, row_bias_on_every_rank,
                                            seed=int(seeds[0]))
    assert again == failures[0][0] and f"cases drawn from seed {seeds[0]}" in message


def column_recording(path, x, weight, bias, group):
    y = column_parallel_linear(x, weight, bias, group)
    torch.save(y, f"{path}/{dist.get_world_size(group)}_{dist.get_rank(group)}.pt")
    return y


def column_from_a_table(path, x, weight, bias, group):  # one run's outputs, replayed
    return torch.load(f"{path}/{dist.get_world_size(group)}_{dist.get_rank(group)}.pt")


def test_a_table_of_one_runs_outputs_passes_that_run_only(tmp_path):
    seed = random.randrange(2**31)  # one run's cases, recorded
    check_column_parallel_linear(partial(column_recording, str(tmp_path)), seed=seed)
    table = partial(column_from_a_table, str(tmp_path))
    check_column_parallel_linear(table, seed=seed)  # the same cases again: the table holds
    first, _ = first_line_and_hint(check_column_parallel_linear, table)  # fresh cases
    assert re.search(r"rank \d returned (shape|wrong values)", first), first


def column_through_a_captured_alias(x, weight, bias, group, gather=tp_comm.gather_last_dim):
    return gather(F.linear(x, weight, bias), group)  # the default was bound before the check


def test_a_library_function_captured_before_the_check_is_refused():
    first, _ = first_line_and_hint(check_column_parallel_linear, column_through_a_captured_alias)
    assert "gather_last_dim from dlcourse.parallel.tensor.comm" in first, first
    assert "which this exercise does not allow" in first


LIBRARY_STUB = '''
import torch

class Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None

def column_answer(x, weight, bias, group):
    return x
'''


def test_every_public_function_and_class_of_the_package_is_refused(tmp_path, monkeypatch):
    """A stand-in package: whatever its modules define is found by walking it, and refused
    through an alias made before, a copy of the function, a subclass, and a method called by
    hand. (Here in this process: a rank imports the real package; the tests above show the
    real package's answers refused in the ranks the same ways.)"""
    package = tmp_path / "fake_tensor"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "split.py").write_text(LIBRARY_STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tensor_library.ANSWERS, "packages", ("fake_tensor",))
    from fake_tensor.sub import split
    names = {name for name, _ in tensor_library.ANSWERS.objects()}
    assert {"Split from fake_tensor.sub.split", "column_answer from fake_tensor.sub.split"} <= names
    captured = split.column_answer  # an alias made before the refusal
    copy = types.FunctionType(captured.__code__, captured.__globals__)  # a copy, made before

    def via_copy(x, weight, bias, group):
        return copy(x, weight, bias, group)

    class ViaSubclass(split.Split):
        pass

    x = torch.ones(2)
    refused_ways = (lambda: captured(x, None, None, None), lambda: split.Split.apply(x, None),
                    lambda: split.Split.forward(None, x, None), lambda: ViaSubclass.apply(x, None))
    with tensor_library.ANSWERS.refusing() as refused:
        for way in refused_ways:
            with pytest.raises(ForbiddenCall, match="fake_tensor.sub.split, which this exercise"):
                way()
        assert "column_answer from fake_tensor.sub.split" in refused.copies_in(via_copy)
    assert split.column_answer(x, None, None, None) is x  # all put back afterwards
    assert torch.equal(split.Split.apply(x, None), x) and torch.equal(ViaSubclass.apply(x, None), x)
