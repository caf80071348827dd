"""Lesson 08's check of zigzag_positions (`dlcourse/checks/context/zigzag_positions.py`): every
rank of cases drawn per run (2 to 8 ranks) against the layout from its definition; other
correct ways pass, the wrong layouts students write fail naming the chunks they hold, and the
lesson's Layout, torch's load balancer and the check's reference are refused."""

import numpy as np
import pytest
import torch

from checking import first_line_and_hint
from dlcourse.checks.context import check_zigzag_positions


def zigzag_positions(rank, cp, seq_len):  # the solution notebook's
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]])


def zigzag_in_numpy(rank, cp, seq_len):
    chunks = np.split(np.arange(seq_len), 2 * cp)
    return np.concatenate([chunks[rank], chunks[-1 - rank]])  # numpy integers: fine


def zigzag_as_ranges(rank, cp, seq_len):
    c = seq_len // (2 * cp)
    return tuple(range(rank * c, (rank + 1) * c)) + tuple(range(seq_len - (rank + 1) * c,
                                                                seq_len - rank * c))


@pytest.mark.parametrize("answer", [zigzag_positions, zigzag_in_numpy, zigzag_as_ranges])
def test_correct_layouts_pass(answer, capsys):
    check_zigzag_positions(answer)
    out = capsys.readouterr().out
    assert "zigzag_positions: passed on 4 cases" in out and "query-key pairs" in out


def contiguous(rank, cp, seq_len):
    n = seq_len // cp
    return list(range(rank * n, (rank + 1) * n))


def mirror_off_by_one(rank, cp, seq_len):  # 2·cp - r: the last rank's tail runs off the end
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[rank], chunks[(2 * cp - rank) % (2 * cp)]])


def tail_first(rank, cp, seq_len):
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat([chunks[2 * cp - 1 - rank], chunks[rank]])


def only_for_four_ranks(rank, cp, seq_len):  # the lesson's cp = 4: 8 chunks
    chunks = torch.arange(seq_len).chunk(8)
    return torch.cat([chunks[rank], chunks[7 - rank]])


@pytest.mark.parametrize("wrong, says, hint", [
    (contiguous, "holds positions", "that is the contiguous layout"),
    (mirror_off_by_one, "(chunks [0, 0] of", "the second chunk is chunk 0"),
    (tail_first, "holds positions", "the right chunks in the wrong order"),
    (only_for_four_ranks, "", "chunk r, then chunk 2·cp - 1 - r"),  # wrong values or raises
])
def test_wrong_layouts_fail_naming_the_chunks(wrong, says, hint):
    first, rest = first_line_and_hint(check_zigzag_positions, wrong)
    assert first.startswith("zigzag_positions(rank=") and says in first
    assert hint in rest


def from_the_lesson(rank, cp, seq_len):
    from dlcourse.parallel.context import Layout
    return Layout("zigzag", cp, seq_len).positions(rank)


def from_torch(rank, cp, seq_len):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _HeadTailLoadBalancer)
    order = _HeadTailLoadBalancer(seq_len, cp, "cpu")._generate_indices()[0]
    return order.chunk(cp)[rank]


def from_the_check(rank, cp, seq_len):
    from dlcourse.checks.context import reference
    return reference.zigzag(rank, cp, seq_len)


@pytest.mark.parametrize("wrong, says", [
    (from_the_lesson, "Layout from dlcourse.parallel.context.layout"),
    (from_torch, "torch's _HeadTailLoadBalancer"),
    (from_the_check, "zigzag from dlcourse.checks.context.reference"),
])
def test_the_answers_are_refused(wrong, says):
    first, _ = first_line_and_hint(check_zigzag_positions, wrong)
    assert says in first and "which this exercise does not allow" in first
