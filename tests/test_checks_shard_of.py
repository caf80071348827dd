"""Lesson 05's check of shard_of (`dlcourse/checks/zero/shard_of.py`): the solutions and correct
answers written other ways pass; the wrong answers students write fail with a message naming the
case, the rank and a hint that says which mistake it was. Every run draws new cases, so each
wrong answer here fails on whatever is drawn."""

import math
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from checking import first_line_and_hint, starts
from dlcourse.checks.zero import check_shard_of
from zero_checking import _flat


# --- exercise 1: shard_of ---------------------------------------------------------------------

def shard_of(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    padded = torch.zeros(N * s, dtype=flat.dtype)
    padded[:flat.numel()] = flat
    return padded[r * s:(r + 1) * s].clone()


def shard_padded_then_chunked(params, group):  # F.pad and chunk
    N = dist.get_world_size(group)
    flat = _flat(params)
    return F.pad(flat, (0, (-flat.numel()) % N)).chunk(N)[dist.get_rank(group)].clone()


def shard_by_offsets(params, group):  # the slice, then zeros after it
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = math.ceil(flat.numel() / N)
    mine = flat[r * s:(r + 1) * s]
    return torch.cat([mine, torch.zeros(s - mine.numel(), dtype=flat.dtype)])


def shard_chunk_unpadded(params, group):
    return _flat(params).chunk(dist.get_world_size(group))[dist.get_rank(group)].clone()


def shard_tensor_split(params, group):  # unequal shards
    return _flat(params).tensor_split(dist.get_world_size(group))[dist.get_rank(group)].clone()


def shard_floor(params, group):  # right only when N divides Ψ
    flat = _flat(params)
    s = flat.numel() // dist.get_world_size(group)
    r = dist.get_rank(group)
    return flat[r * s:(r + 1) * s].clone()


def shard_view(params, group):  # right only when N divides Ψ
    return _flat(params).view(dist.get_world_size(group), -1)[dist.get_rank(group)].clone()


def shard_by_parameter(params, group):  # ZeroRedundancyOptimizer's way
    mine = params[dist.get_rank(group)::dist.get_world_size(group)]
    return _flat(mine) if mine else _flat(params)[:0]


def shard_padded_with_ones(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    return F.pad(flat, (0, N * s - flat.numel()), value=1.0)[r * s:(r + 1) * s].clone()


def shard_padded_in_front(params, group):
    N, r = dist.get_world_size(group), dist.get_rank(group)
    flat = _flat(params)
    s = -(-flat.numel() // N)
    return F.pad(flat, (N * s - flat.numel(), 0))[r * s:(r + 1) * s].clone()


@pytest.mark.parametrize("answer", [shard_of, shard_padded_then_chunked, shard_by_offsets])
def test_shard_of_passes_correct_answers(answer, capsys):
    check_shard_of(answer)
    assert "shard_of: passed on 3 cases" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (shard_chunk_unpadded, "rank ?", ""),  # fewer chunks than ranks, or short ones
    (shard_tensor_split, "rank ? returned shape", "pad with zeros"),
    (shard_floor, "rank ? returned shape", "rounds down"),
    (shard_view, "rank ? raised RuntimeError", ""),
    (shard_by_parameter, "rank ?", ""),
    (shard_padded_with_ones, "rank ? returned wrong values", "must be zeros"),
    (shard_padded_in_front, "rank ? returned wrong values", ""),
])
def test_shard_of_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_shard_of, answer)
    assert re.match(r"shard_of on \d ranks, .*: rank \d", first), first
    assert starts(first.split(": ", 1)[1], says), first
    assert hint in got_hint


def test_shard_by_parameter_is_named_when_it_returns_whole_parameters():
    # a case with several parameters, where rank 0's whole ones are not its shard: a few seeds
    for seed in range(20):
        try:
            check_shard_of(shard_by_parameter, seed=seed)
        except AssertionError as error:
            if "whole parameters" in str(error):
                return
    pytest.fail("no drawn case named the whole-parameter mistake")


def _message(check, answer, **kwargs):
    with pytest.raises(AssertionError) as failed:
        check(answer, **kwargs)
    return str(failed.value)


def test_cases_are_drawn_afresh_and_a_seed_replays_them():
    seeds = [re.search(r"cases drawn from seed (\d+)", _message(check_shard_of, shard_floor))
             for _ in range(2)]
    assert all(seeds) and seeds[0].group(1) != seeds[1].group(1)
    seed = int(seeds[0].group(1))
    again = [_message(check_shard_of, shard_floor, seed=seed).splitlines()[0] for _ in range(2)]
    assert again[0] == again[1]
