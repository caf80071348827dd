"""Lesson 05's checks refuse the lesson's ZeRO code (`dlcourse.parallel.zero`) however it is
reached."""

import sys

import pytest
import torch.distributed as dist
import torch.nn.functional as F

import dlcourse.checks.zero.zero_bytes_per_rank as zero_checks
from checking import first_line_and_hint
from dlcourse.checks.zero import check_shard_of, check_zero_bytes_per_rank
from test_checks_zero_bytes_per_rank import _bytes
from zero_checking import _flat


# --- the library's answers, however they are reached ------------------------------------------

LIBRARY_STUB = '''
class ZeroStage3:
    def __init__(self, model):
        self.model = model

def shard_flat(flat, world_size, rank):
    return flat.chunk(world_size)[rank]

def zero_bytes(n_params, world_size, stage, mixed_precision):
    return {"params": 0, "grads": 0, "optimizer": 0}
'''


def test_every_public_function_and_class_of_the_package_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "fake_zero"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "stages.py").write_text(LIBRARY_STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(zero_checks.BYTES_ANSWERS, "packages", ("fake_zero",))
    from fake_zero.sub import stages
    names = {name for name, _ in zero_checks.BYTES_ANSWERS.objects()}
    assert {f"{n} from fake_zero.sub.stages" for n in ("ZeroStage3", "shard_flat",
                                                         "zero_bytes")} <= names
    captured = stages.zero_bytes  # an alias made before the check runs

    def via_alias(n_params, world_size, stage, mixed_precision):
        return captured(n_params, world_size, stage, mixed_precision)

    def via_class(n_params, world_size, stage, mixed_precision):
        sys.modules["fake_zero.sub.stages"].ZeroStage3(None)

    for answer in (via_alias, via_class):
        first, _ = first_line_and_hint(check_zero_bytes_per_rank, answer)
        assert "which this exercise does not allow" in first, first
    assert stages.zero_bytes(1, 1, 0, True)["params"] == 0  # all put back afterwards
    assert stages.ZeroStage3("m").model == "m"


# the lesson's own code, dlcourse.parallel.zero, reached by its names and through aliases

def shard_from_the_library(params, group):
    from dlcourse.parallel.zero.shards import FlatShard
    layout = FlatShard([str(i) for i in range(len(params))], params,
                       dist.get_world_size(group), dist.get_rank(group))
    return layout.my_shard(layout.flatten([p.detach() for p in params])).clone()


def shard_from_the_library_bounds(params, group):
    import dlcourse.parallel.zero as zero
    flat = _flat(params)
    start, end = zero.shard_bounds(flat.numel(), dist.get_world_size(group), dist.get_rank(group))
    return F.pad(flat, (0, end - start))[start:end].clone()


def bytes_from_the_lesson(n_params, world_size, stage, mixed_precision):
    from dlcourse.parallel.zero import shard_numel
    return _bytes(n_params, world_size, stage, mixed_precision, shard_numel)


@pytest.mark.parametrize("check, answer", [
    (check_shard_of, shard_from_the_library),
    (check_shard_of, shard_from_the_library_bounds),
    (check_zero_bytes_per_rank, bytes_from_the_lesson),
])
def test_the_lessons_zero_code_is_refused(check, answer):
    first, _ = first_line_and_hint(check, answer)
    assert "dlcourse.parallel.zero" in first and "which this exercise does not allow" in first, \
        first
