"""The nccl and CUDA paths of the launcher. They need GPUs, so CI (CPU only) skips them."""

import torch
import torch.distributed as dist

import dlcourse
from conftest import needs_gpu


def _cuda_all_reduce():
    t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(t)
    return dist.get_backend(), str(t.device), t.cpu().tolist()


@needs_gpu
def test_nccl_on_one_gpu():
    backend, device, values = dlcourse.launch(_cuda_all_reduce, world_size=1, backend="nccl")[0]
    assert (backend, device, values) == ("nccl", "cuda:0", [1.0] * 4)


@needs_gpu
def test_auto_picks_nccl_when_every_rank_has_a_gpu(capsys):
    n = torch.cuda.device_count()
    results = dlcourse.launch(_cuda_all_reduce, world_size=n)
    assert "on nccl" in capsys.readouterr().out
    assert [r[2] for r in results] == [[n * (n + 1) / 2] * 4] * n


@needs_gpu
def test_auto_falls_back_to_gloo_with_more_ranks_than_gpus(capsys):
    n = torch.cuda.device_count() + 1
    out = dlcourse.launch(lambda: dist.get_backend(), world_size=n)
    assert out == ["gloo"] * n
    assert f"{n - 1} GPU(s) for {n} ranks: nccl needs one per rank" in capsys.readouterr().out


@needs_gpu
def test_the_tour_runs_on_gpus_and_matches_the_reference():
    from dlcourse import tour

    n = min(torch.cuda.device_count(), 2)
    table = tour.run(world_size=n, steps=2, backend="nccl", out=lambda *_: None)
    assert all(row["matches"] for row in table), table
