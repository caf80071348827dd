"""Lesson 11's torch API (dlcourse/checkpoint/torch_api.py): DCP saves FSDP2 and DTensor TP on real
ranks and loads them under another mesh, equal to the saved state; async_save returns."""

import pytest

import dlcourse
from dlcourse.checkpoint.reshard import ShardConfig
from dlcourse.checkpoint.torch_api import async_timing_job, dcp_load_job, dcp_save_job


@pytest.mark.parametrize("kind,n,into,m", [("fsdp2", 4, "fsdp2", 2), ("tp", 2, "dp_tp", 4)])
def test_dcp_loads_under_another_mesh_equal_to_the_saved_state(tmp_path, kind, n, into, m):
    cfg = ShardConfig()
    params, moments = dlcourse.launch(dcp_save_job, str(tmp_path), kind, cfg, world_size=n)[0]
    for got_params, got_moments in dlcourse.launch(dcp_load_job, str(tmp_path), into, cfg,
                                                   world_size=m):
        assert set(got_params) == set(params) and set(got_moments) == set(moments)
        assert all((got_params[k] - params[k]).abs().max() == 0 for k in params)
        assert all((got_moments[k] - moments[k]).abs().max() == 0 for k in moments)


def test_async_save_finishes_and_blocks_for_a_positive_time(tmp_path):
    # timings are not asserted against each other: unit tests do not time (benchmarks/ would)
    for sync_s, async_s, done_s in dlcourse.launch(async_timing_job, str(tmp_path), ShardConfig(),
                                                   rounds=1, world_size=2):
        assert sync_s > 0 and 0 < async_s <= done_s
    assert (tmp_path / "async_0" / ".metadata").exists()  # the thread's write committed
