"""The rank grid (`dlcourse/parallel/grid.py`): coordinates and groups against torch's own
DeviceMesh (its flattened "dp_cp" mesh for the dp x cp replicas), and sizes refused with the
arithmetic before any process starts."""

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import dlcourse
from dlcourse.models import GPTConfig
from dlcourse.parallel.grid import RankGrid


@pytest.mark.parametrize("grid", [RankGrid(dp=2, tp=3, pp=2), RankGrid(dp=3, tp=1, pp=4),
                                  RankGrid(dp=2, tp=2, pp=2, order=("tp", "pp", "dp")),
                                  RankGrid(dp=2, cp=3, tp=2),
                                  RankGrid(dp=2, cp=2, tp=2, pp=2, order=("cp", "tp", "pp", "dp"))])
def test_every_axis_partitions_the_ranks_and_coords_invert(grid):
    for axis in grid.order:
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


def test_cp_sits_between_dp_and_tp_by_default_and_is_left_out_when_1():
    grid = RankGrid(dp=2, cp=2, tp=2)
    assert grid.order == ("pp", "dp", "cp", "tp")
    assert grid.axis_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.axis_groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.axis_groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    three = RankGrid(dp=2, tp=2, pp=2)  # lessons 04-07's grid is what it was
    assert three.order == ("pp", "dp", "tp") and set(three.coords(5)) == {"pp", "dp", "tp"}
    assert three.axis_groups("cp") == [[r] for r in range(8)]


@pytest.mark.parametrize("grid", [RankGrid(dp=2, cp=3, tp=2), RankGrid(dp=3, cp=2, pp=2),
                                  RankGrid(dp=2, cp=2, tp=2, order=("cp", "tp", "pp", "dp")),
                                  RankGrid(dp=2, tp=2, pp=2), RankGrid(cp=4, tp=2)])
def test_the_dp_cp_groups_hold_the_ranks_that_share_the_weights(grid):
    """A dp_cp group: every rank with the same tp and pp coordinates (the same weights), dp x cp
    of them, and it is the union of those ranks' dp groups and of their cp groups."""
    groups = grid.axis_groups("dp_cp")
    assert sorted(r for g in groups for r in g) == list(range(grid.world_size))
    for g in groups:
        assert len(g) == grid.dp * grid.cp
        same = {(grid.coords(r).get("tp", 0), grid.coords(r).get("pp", 0)) for r in g}
        assert len(same) == 1, g
        for r in g:
            assert set(grid.axis_ranks("dp", r)) <= set(g) and set(grid.axis_ranks("cp", r)) <= set(g)


def _groups_beside_device_mesh(grid):
    """In every rank: this grid's groups and DeviceMesh's for the same shape, as rank lists
    (with cp, also dp_cp beside torch's mesh["dp", "cp"] flattened)."""
    ours = grid.new_groups()
    mesh = init_device_mesh("cpu", grid.shape, mesh_dim_names=grid.order)
    torchs = {axis: mesh[axis] for axis in grid.order}
    if "cp" in grid.order:
        both = tuple(a for a in grid.order if a in ("dp", "cp"))  # sliced in the mesh's order
        torchs["dp_cp"] = mesh[both]._flatten("dp_cp")
    return {axis: (dist.get_process_group_ranks(ours.groups[axis]),
                   dist.get_process_group_ranks(sub.get_group()))
            for axis, sub in torchs.items()}


GRIDS_4 = [RankGrid(dp=2, tp=2), RankGrid(pp=2, tp=2), RankGrid(dp=2, tp=2, order=("pp", "tp", "dp")),
           RankGrid(dp=2, cp=2), RankGrid(cp=2, tp=2)]


def _groups_of_grids(grids):
    return [_groups_beside_device_mesh(grid) for grid in grids]


def _check_beside_device_mesh(grids, per_rank):
    for rank, per_grid in enumerate(per_rank):
        for grid, axes in zip(grids, per_grid):
            for axis, (ours, torchs) in axes.items():
                assert ours == torchs, f"{grid}, rank {rank}, axis {axis}"
                assert rank in ours


def test_each_ranks_groups_are_the_ones_torch_device_mesh_makes():
    _check_beside_device_mesh(GRIDS_4, dlcourse.launch(_groups_of_grids, GRIDS_4, world_size=4,
                                                       backend="gloo"))


def test_the_four_axis_grid_and_its_dp_cp_groups_are_device_meshs():
    grids = [RankGrid(dp=2, cp=2, tp=2), RankGrid(dp=2, cp=2, tp=2, order=("cp", "tp", "pp", "dp"))]
    _check_beside_device_mesh(grids, dlcourse.launch(_groups_of_grids, grids, world_size=8,
                                                     backend="gloo"))


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
    with pytest.raises(ValueError, match=r"cp may be left out when cp = 1\), got \('pp', 'dp', 'tp'\)"):
        RankGrid(cp=2, order=("pp", "dp", "tp"))
    with pytest.raises(ValueError, match="RankGrid.cp must be a whole number >= 1, got 0"):
        RankGrid(cp=0)
    with pytest.raises(ValueError, match=r"pp 1 x dp 2 x cp 2 x tp 2 = 8 ranks, but the job has 4"):
        RankGrid(dp=2, cp=2, tp=2).check_world_size(4)
    with pytest.raises(ValueError, match="unknown axis 'ep'"):
        RankGrid().axis_groups("ep")
    with pytest.raises(ValueError, match="3 micro-batches cannot keep 4 stages busy"):
        RankGrid(pp=4).check_model(GPTConfig(n_layers=4), micro_batches=3)
    with pytest.raises(ValueError, match=r"pp 1 x dp 2 x tp 2 = 4 ranks, but the job has 8"):
        RankGrid(dp=2, tp=2).check_world_size(8)


@pytest.mark.parametrize("grid", [RankGrid(dp=2, tp=2, pp=2), RankGrid(dp=2, cp=2, tp=2),
                                  RankGrid(cp=4), RankGrid(dp=1, cp=2, tp=2, pp=2)])
def test_the_grid_picture_draws_every_rank_apart_and_each_group_through_its_ranks(grid):
    import matplotlib

    matplotlib.use("Agg")
    from dlcourse.plots.grid import plot_rank_grid, rank_position

    places = [rank_position(grid, r) for r in range(grid.world_size)]
    assert len(set(places)) == grid.world_size  # no rank hides another (cp ranks did)
    ax = plot_rank_grid(grid)
    lines = {axis: [ln for ln in ax.get_lines() if ln.get_color() == colour]
             for axis, colour in (("tp", "tab:red"), ("dp", "tab:blue"), ("pp", "tab:green"),
                                  ("cp", "tab:purple"))}
    for axis, drawn in lines.items():
        groups = grid.axis_groups(axis) if getattr(grid, axis) > 1 else []
        assert len(drawn) == len(groups), axis
        for line, ranks in zip(drawn, groups):  # each line starts and ends on its group's ends
            xs, ys = line.get_data()
            assert (xs[0], ys[0]) == places[ranks[0]] and (xs[-1], ys[-1]) == places[ranks[-1]]
