"""The checks' own references and simulators are answer keys a student could import (issue 28):
while the student's function runs, every function of its exercise set's check modules raises
ForbiddenCall, named in the first line a student (and the gradebook) reads; afterwards the check
uses them again. Each key here would pass its check if it were not refused."""

import torch
import torch.distributed as dist

from checking import first_line_and_hint, starts
from dlcourse.checks.pipeline import check_bubble_fraction, check_schedule_1f1b
from dlcourse.checks.zero import check_shard_of, check_zero_bytes_per_rank

NOT_ALLOWED = "which this exercise does not allow: it is the check's own answer key"


def shard_by_the_key(params, group):
    from dlcourse.checks.zero.cases import padded_shard
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    return padded_shard(flat, dist.get_world_size(group), dist.get_rank(group)).clone()


def bytes_by_the_key(n_params, world_size, stage, mixed_precision):
    from dlcourse.checks.zero.zero_bytes_per_rank import STAGE_PARTS, measured_bytes
    return {part: measured_bytes(n_params, world_size, part, part in STAGE_PARTS[stage],
                                 mixed_precision) for part in ("params", "grads", "optimizer")}


def schedule_by_the_key(rank, n_stages, n_micro):
    from dlcourse.checks.pipeline.schedule_1f1b import one_f_one_b
    return one_f_one_b(rank, n_stages, n_micro)


def bubble_by_the_key(n_stages, n_micro):
    from dlcourse.checks.pipeline.bubble_fraction import _simulated_bubble
    return _simulated_bubble(n_stages, n_micro)


def test_shard_of_refuses_the_checks_padded_shard():
    first, _ = first_line_and_hint(check_shard_of, shard_by_the_key)
    assert starts(first.split(": ", 1)[1], "rank ? called padded_shard from "
                                           "dlcourse.checks.zero.cases, " + NOT_ALLOWED), first


def test_zero_bytes_per_rank_refuses_the_checks_measured_bytes():
    first, _ = first_line_and_hint(check_zero_bytes_per_rank, bytes_by_the_key)
    says = f"called measured_bytes from dlcourse.checks.zero.zero_bytes_per_rank, {NOT_ALLOWED}"
    assert says in first, first


def test_schedule_1f1b_refuses_the_checks_one_f_one_b():
    first, _ = first_line_and_hint(check_schedule_1f1b, schedule_by_the_key)
    says = "rank ? called one_f_one_b from dlcourse.checks.pipeline.schedule_1f1b, " + NOT_ALLOWED
    assert starts(first.split(": ", 1)[1], says), first


def test_bubble_fraction_refuses_the_checks_simulator():
    first, _ = first_line_and_hint(check_bubble_fraction, bubble_by_the_key)
    says = f"called _simulated_bubble from dlcourse.checks.pipeline.bubble_fraction, {NOT_ALLOWED}"
    assert says in first, first


def test_the_keys_work_again_after_a_check():
    from dlcourse.checks.pipeline.bubble_fraction import _simulated_bubble
    from dlcourse.checks.pipeline.schedule_1f1b import one_f_one_b
    first_line_and_hint(check_bubble_fraction, bubble_by_the_key)
    assert abs(_simulated_bubble(2, 2) - 1 / 3) < 1e-12  # (p - 1) / (m + p - 1)
    assert [a[0] for a in one_f_one_b(1, 2, 1)] == ["F", "B"]
