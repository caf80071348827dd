"""The rank grid (`dlcourse/parallel/grid.py`): coordinates and groups against torch's own
DeviceMesh, and sizes refused with the arithmetic before any process starts."""

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import dlcourse
from dlcourse.models import GPTConfig
from dlcourse.parallel.grid import AXES, RankGrid


@pytest.mark.parametrize("grid", [RankGrid(dp=2, tp=3, pp=2), RankGrid(dp=3, tp=1, pp=4),
                                  RankGrid(dp=2, tp=2, pp=2, order=("tp", "pp", "dp"))])
def test_every_axis_partitions_the_ranks_and_coords_invert(grid):
    for axis in AXES:
        groups = grid.axis_groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(grid.world_size))
        assert all(len(g) == getattr(grid, axis) for g in groups)
        for g in groups:  # a group's ranks differ on this axis only
            coords = [grid.coords(r) for r in g]
            assert [c[axis] for c in coords] == list(range(len(g)))
            assert all({k: v for k, v in c.items() if k != axis}
                       == {k: v for k, v in coords[0].items() if k != axis} for c in coords)
    assert [grid.rank_of(grid.coords(r)) for r in range(grid.world_size)] == \
        list(range(grid.world_size))


def test_tp_is_innermost_by_default_so_its_ranks_are_consecutive():
    assert RankGrid(dp=2, tp=4).axis_groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _groups_beside_device_mesh(grid):
    """In every rank: this grid's groups and DeviceMesh's for the same shape, as rank lists."""
    ours = grid.new_groups()
    mesh = init_device_mesh("cpu", grid.shape, mesh_dim_names=grid.order)
    return {axis: (dist.get_process_group_ranks(ours.groups[axis]),
                   dist.get_process_group_ranks(mesh[axis].get_group()))
            for axis in grid.order}


@pytest.mark.parametrize("grid", [RankGrid(dp=2, tp=2), RankGrid(pp=2, tp=2),
                                  RankGrid(dp=2, tp=2, order=("pp", "tp", "dp"))])
def test_each_ranks_groups_are_the_ones_torch_device_mesh_makes(grid):
    for rank, axes in enumerate(dlcourse.launch(_groups_beside_device_mesh, grid, world_size=4,
                                                backend="gloo")):
        for axis, (ours, torchs) in axes.items():
            assert ours == torchs, f"rank {rank}, axis {axis}"
            assert rank in ours


@pytest.mark.parametrize("grid, config, says", [
    (RankGrid(tp=3), GPTConfig(), "tp 3 does not divide n_heads 4 (4 / 3 = 1.33333)"),
    (RankGrid(tp=2), GPTConfig(vocab_size=129), "tp 2 does not divide vocab_size 129"),
    (RankGrid(pp=3), GPTConfig(n_layers=2), "pp 3 is more stages than the model's 2 layers"),
])
def test_sizes_the_model_cannot_be_cut_into_are_refused_with_the_arithmetic(grid, config, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        grid.check_model(config)


def test_bad_sizes_and_too_few_micro_batches_are_refused():
    with pytest.raises(ValueError, match="RankGrid.tp must be a whole number >= 1, got 0"):
        RankGrid(tp=0)
    with pytest.raises(ValueError, match="must name each of"):
        RankGrid(order=("dp", "tp"))
    with pytest.raises(ValueError, match="3 micro-batches cannot keep 4 stages busy"):
        RankGrid(pp=4).check_model(GPTConfig(n_layers=4), micro_batches=3)
    with pytest.raises(ValueError, match=r"pp 1 x dp 2 x tp 2 = 4 ranks, but the job has 8"):
        RankGrid(dp=2, tp=2).check_world_size(8)
