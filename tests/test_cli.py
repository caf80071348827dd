"""The `dlcourse` command: info and tour, run as a user runs them."""

import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse import backends, cli, tour
from dlcourse.models import GPTConfig
from dlcourse.parallel.combine import GridPlan, activation_formula
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.context.measure import cp_saved_tensors
from dlcourse.strategies import Strategy, TourConfig, Trainer
from dlcourse.strategies.catalogue import whole
from dlcourse.strategies.combine import PLANS
from dlcourse.strategies.context import METHODS as METHOD_ROWS
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
        if line is None:  # a grid of 4 or 8 ranks cannot run on 2: said, with the ranks it needs
            n = PLANS[row.name].grid.world_size
            assert f"not run: {row.name} needs {n} ranks: run it with --world-size {n}" in table
            skipped.append(row.name)
            continue
        assert " yes " in line, line
    assert skipped == list(PLANS), skipped  # only the grids of lesson 07 need more ranks
    assert "Every strategy matches the single-process reference" in done.stdout
    for row in tour.ROWS:  # a row judged by a tolerance of its own says so in the last line
        if row.tolerance != tour.MATCH_TOLERANCE and row.name not in skipped:
            assert f"{row.name} within {row.tolerance:g}" in table[-1], table[-1]
    _activation_column_is_the_lessons_count(table)


def _activation_column_is_the_lessons_count(table):
    """Each counted row's busiest rank holds what lessons 01, 04, 06 and 08 count, to the byte, at
    2 ranks; ZeRO divides the model state, never the activations, so its rows equal DP's."""
    config, batch = GPTConfig(), TourConfig().global_batch
    dp, tp = GridPlan(RankGrid(dp=2)), GridPlan(RankGrid(tp=2))
    plans = {"single process (reference)": GridPlan(RankGrid()), "TP (lesson 04)": tp,
             "TP + SP (lesson 04)": GridPlan(RankGrid(tp=2), sequence_parallel=True),
             **{f"DP {v} (lesson 03)": dp for v in ("naive", "bucketed", "overlapped")},
             "torch DDP": dp, **{f"ZeRO stage {s} (lesson 05)": dp for s in ("1", "2", "3")},
             "ZeRO stage 2 + offload (lesson 05: ZeRO-Offload)": dp,
             "ZeRO stage 3 + offload (lesson 05)": dp,
             **{f"PP {s} (lesson 06)": GridPlan(RankGrid(pp=2), schedule=s,
                                               micro_batches=TourConfig().pipeline_micro_batches)
                for s in ("GPipe", "1F1B", "ZB-H1")}}
    header = re.split(r"\s{2,}", table[next(i for i, l in enumerate(table)
                                            if l.startswith("strategy"))])
    column = header.index("activation bytes (busiest rank)")
    for name, plan in plans.items():
        cells = re.split(r"\s{2,}", next(l for l in table if l.startswith(name)))
        got = int(cells[column].replace(",", ""))
        assert got == activation_formula(config, plan, batch), (name, got)
    for name, method in METHOD_ROWS.items():  # lesson 08: every rank's s/2 tokens, proven estimate
        cells = re.split(r"\s{2,}", next(l for l in table if l.startswith(name)))
        got = int(cells[column].replace(",", ""))
        assert got == sum(r.nbytes for r in cp_saved_tensors(config, batch, 2, method)), (name, got)


def _build_without_averaging(cfg, groups):
    """A plausible bug: each rank trains on its shard and never all-reduces its gradients."""
    model = cfg.new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):
        x, y = shard_batch((x, y), groups.dp)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
    full = lambda: dict(model.named_parameters())  # noqa: E731
    return Trainer([model], optimizer, train_step, full)


def test_tour_flags_a_strategy_that_does_not_match():
    rows = [Strategy("no gradient averaging", "03", whole("dp"), _build_without_averaging)]
    table = tour.run(world_size=2, steps=2, backend="gloo", rows=rows, out=lambda *_: None)
    assert [r["matches"] for r in table] == [True, False]
    assert table[1]["max |Δ| vs reference"] > 100 * tour.MATCH_TOLERANCE


def test_tour_refuses_a_world_size_that_does_not_split_the_batch():
    done = dlcourse_command("tour", "--world-size", "3")
    assert done.returncode == 2
    assert "--world-size 3 does not divide the global batch of 16 sequences" in done.stderr


def test_tour_names_the_context_parallel_rows_a_world_size_cannot_split():
    """Before any rank starts: at 8 ranks Ulysses cannot split the tour GPT's 4 heads, and says
    so with the arithmetic; the ring and zig-zag (32 tokens in 8 or 16 chunks) still run. At 64
    ranks no layout divides the 32 tokens."""
    rows = [r for r in tour.ROWS if r.name in METHOD_ROWS]
    for world_size, refused in ((8, {"CP Ulysses (lesson 08)": "cp 8 does not divide n_heads 4"}),
                                (64, {"CP ring (lesson 08)": "64 chunks (cp 64)",
                                      "CP zig-zag ring (lesson 08)": "128 chunks (cp 64)",
                                      "CP Ulysses (lesson 08)": "64 chunks (cp 64)",
                                      "CP all-gather KV (lesson 08)": "64 chunks (cp 64)"})):
        said = []
        runnable = tour._runnable(rows, TourConfig(), world_size, said.append)
        assert [r.name for r in runnable] == [n for n in METHOD_ROWS if n not in refused]
        assert len(said) == len(refused)
        for line, (name, why) in zip(said, refused.items()):
            assert line.startswith(f"skipped {name} at {world_size} ranks: ") and why in line, line


def test_tour_names_the_expert_parallel_row_a_world_size_cannot_split():
    """Before any rank starts: the MoE GPT's 4 experts cannot be dealt out to 8 ranks, and the
    row says so with the arithmetic; at 4 ranks (one expert each) it runs."""
    rows = [r for r in tour.ROWS if r.name == "EP + DP (lesson 09, MoE GPT)"]
    said = []
    assert tour._runnable(rows, TourConfig(), 4, said.append) == rows and said == []
    assert tour._runnable(rows, TourConfig(), 8, said.append) == []
    assert said == ["skipped EP + DP (lesson 09, MoE GPT) at 8 ranks: ep 8 does not divide "
                    "n_experts 4 (4 / 8 = 0.5); every rank holds E/ep whole experts: use "
                    "n_experts a multiple of 8"]


def test_tour_runs_the_expert_parallel_row_on_nccl_too():
    """The row is no longer refused on nccl (every tensor of its path follows the input's
    device); test_gpu's tour runs it on GPUs and compares it with one process."""
    rows = [r for r in tour.ROWS if r.name == "EP + DP (lesson 09, MoE GPT)"]
    said = []
    assert tour._runnable(rows, TourConfig(cuda=True), 2, said.append) == rows and said == []


def _ep_bytes_two_ways():
    """One counted step of the tour's EP row: its byte count beside the counter's tensor sizes
    with the rows that stayed on this rank taken out (every all-to-all: counts and rows)."""
    from dlcourse.collectives.counter import CommCounter
    from dlcourse.models import MoEGPT
    from dlcourse.parallel.expert import expert_parallel
    from dlcourse.parallel.expert.measure import rows_moved
    from dlcourse.parallel.expert.compare import ep_step
    from dlcourse.strategies.expert import moe_config, sent_bytes
    cfg, group = TourConfig(), dist.group.WORLD
    ep, x_y = dist.get_world_size(), shard_batch(cfg.data(), group)
    model = expert_parallel(MoEGPT(moe_config(cfg)), group)
    with CommCounter() as comm:
        ep_step(model, torch.optim.AdamW(model.parameters()), *x_y, group)
    own_rows = sum(rows_moved(moe, group)["own"] for moe in model.moe_layers())
    stayed = 4 * own_rows * cfg.model.hidden * 4 + len(model.moe_layers()) * 4 * 8 // ep
    counted = sum(r.nbytes for r in comm.records if r.op == "all_to_all") - stayed
    counted += sum(r.bus_bytes() for r in comm.records if r.op != "all_to_all")
    return sent_bytes(comm, model, group), counted


def test_tour_ep_row_counts_the_bytes_that_leave_each_rank():
    """4 all-to-alls of rows per MoE layer (dispatch, combine, and their backward), each sending
    all but the rows of this rank's own experts, plus the counts exchange (E/ep of E stay)."""
    for got, want in dlcourse.launch(_ep_bytes_two_ways, world_size=2, backend="gloo"):
        assert got == want and got > 0, (got, want)
