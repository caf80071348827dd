"""The `dlcourse` command: info and tour, run as a user runs them."""

import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from dlcourse import backends, cli, tour
from dlcourse.models import GPTConfig
from dlcourse.parallel.combine import GridPlan, activation_formula
from dlcourse.parallel.grid import RankGrid
from dlcourse.tour.combine import PLANS
from dlcourse.tour.common import TourConfig
from dlcourse.tour.pipeline import N_MICRO
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.backends import cpu_cores


def dlcourse_command(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "dlcourse.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_info_describes_this_machine():
    done = dlcourse_command("info")
    assert done.returncode == 0, done.stderr
    assert torch.__version__ in done.stdout
    assert re.search(rf"^CPU cores +{cpu_cores()}$", done.stdout, re.M)
    gpus = torch.cuda.device_count()
    for n in (1, 2, 4, 8):
        expected = "nccl" if gpus >= n else "gloo"
        assert re.search(rf"^auto, {n} ranks? +{expected} \(", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("version, says", [
    ("2.12.1", "older than the tested range"),
    ("3.0.0", "newer than the tested range"),
    ("2.16.0.dev20261101+cpu", "not a release: outside the tested range"),
    (f"{backends.TESTED_TORCH[0]}+cpu", "within the tested range"),
    (f"{backends.TESTED_TORCH[1]}+cu132", "within the tested range"),
])
def test_info_says_where_torch_stands_against_the_tested_range(monkeypatch, capsys, version, says):
    monkeypatch.setattr(torch, "__version__", version)
    assert cli.info(None) == 0
    low, high = backends.TESTED_TORCH
    torch_row = capsys.readouterr().out.splitlines()[0]
    assert re.fullmatch(rf"torch +{re.escape(version)} \({says} {low} to {high}\b.*\)", torch_row)


def test_tour_prints_every_row_matching_the_reference():
    done = dlcourse_command("tour", "--steps", "2", "--world-size", "2", "--backend", "gloo")
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.splitlines()
    skipped = []
    for row in tour.ROWS:
        line = next((l for l in table if l.startswith(row.name)), None)
        if line is None:  # a grid of 4 or 8 ranks cannot run on 2: said, with the reason
            assert any(l.startswith(f"skipped {row.name} at 2 ranks: the grid ") for l in table)
            skipped.append(row.name)
            continue
        assert " yes " in line, line
    assert skipped == list(PLANS), skipped  # only the grids of lesson 07 need more ranks
    assert "Every strategy matches the single-process reference" in done.stdout
    _activation_column_is_the_lessons_count(table)


def _activation_column_is_the_lessons_count(table):
    """Each counted row's busiest rank holds what lessons 01, 04 and 06 count, to the byte, at
    2 ranks; ZeRO divides the model state, never the activations, so its rows equal DP's."""
    config, batch = GPTConfig(), TourConfig().global_batch
    dp, tp = GridPlan(RankGrid(dp=2)), GridPlan(RankGrid(tp=2))
    plans = {"single process (reference)": GridPlan(RankGrid()), "TP (lesson 04)": tp,
             "TP + SP (lesson 04)": GridPlan(RankGrid(tp=2), sequence_parallel=True),
             **{f"DP {v} (lesson 03)": dp for v in ("naive", "bucketed", "overlapped")},
             "torch DDP": dp, **{f"ZeRO stage {s} (lesson 05)": dp for s in ("1", "2", "3")},
             "ZeRO stage 3 + offload (lesson 05)": dp,
             **{f"PP {s} (lesson 06)": GridPlan(RankGrid(pp=2), micro_batches=N_MICRO, schedule=s)
                for s in ("GPipe", "1F1B", "ZB-H1")}}
    header = re.split(r"\s{2,}", table[next(i for i, l in enumerate(table)
                                            if l.startswith("strategy"))])
    column = header.index("activation bytes (busiest rank)")
    for name, plan in plans.items():
        cells = re.split(r"\s{2,}", next(l for l in table if l.startswith(name)))
        got = int(cells[column].replace(",", ""))
        assert got == activation_formula(config, plan, batch), (name, got)


def _train_without_averaging(cfg):
    """A plausible bug: each rank trains on its shard and never all-reduces its gradients."""
    model = cfg.new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    x, y = shard_batch(cfg.data(), dist.group.WORLD)
    loss, step_time = tour.timed_steps(cfg, model, optimizer, x, y)
    return tour.RowResult(loss, tour.cpu_params(model), tour.held_bytes(model, optimizer), None,
                          step_time)


def test_tour_flags_a_strategy_that_does_not_match():
    rows = [tour.ROWS[0], tour.Row("no gradient averaging", _train_without_averaging)]
    table = tour.run(world_size=2, steps=2, backend="gloo", rows=rows, out=lambda *_: None)
    assert [r["matches"] for r in table] == [True, False]
    assert table[1]["max |Δ| vs reference"] > 100 * tour.MATCH_TOLERANCE


def test_tour_refuses_a_world_size_that_does_not_split_the_batch():
    done = dlcourse_command("tour", "--world-size", "3")
    assert done.returncode == 2
    assert "--world-size 3 does not divide the global batch of 16 sequences" in done.stderr
