"""`dlcourse tour`: the whole course in one table.

Trains the course GPT with every strategy built so far, each on real ranks, checks each against
the single-process reference, and prints: strategy, final loss, max difference from the
reference, model-state bytes per rank, the activation bytes of the busiest rank ("-" where
lesson 01's saved-tensor log cannot key a row's parameters: DTensor, FSDP2, torch's ZeRO),
communication bytes per step, step time.

A strategy is a row in `ROWS`: a name and a function that runs on every rank and returns a
`RowResult` (`common.py`). Each lesson's rows live in a module of their own here, built from that
strategy's wrap / train / count functions: `data.py` for lesson 03, `tensor.py` for lesson 04, `zero.py` for
lesson 05, `pipeline.py` for lesson 06, `combine.py` for lesson 07, `context.py` for lesson 08,
`experts.py` for lesson 09 (an MoE GPT, compared with its own one-process run).
A row that cannot run on the chosen number of ranks (tp must divide the heads; Ulysses' cp too;
ep must divide the experts) says why and is left out.
"""

from functools import partial

from tqdm.auto import tqdm

import dlcourse
from dlcourse import backends
from dlcourse.memory import count_params
from dlcourse.parallel.data.compare import DDP
from dlcourse.parallel.tensor import check_tp
from dlcourse.tour.common import (MATCH_TOLERANCE, Row, RowResult, TourConfig, cpu_params,  # noqa: F401
                                  held_bytes, mean_over_ranks, timed_steps, train_reference)
from dlcourse.tour.combine import PLANS, check_grid_row, train_grid_row
from dlcourse.tour.context import METHOD_ROWS, check_cp_row, train_cp_row
from dlcourse.tour.data import train_dp_row
from dlcourse.tour.experts import check_ep_row, train_ep_row
from dlcourse.tour.pipeline import TORCH, train_interleaved_row, train_pp_row
from dlcourse.tour.tensor import train_tp_row
from dlcourse.tour.zero import train_zero_row

ROWS = [
    Row("single process (reference)", train_reference, distributed=False),
    Row("DP naive (lesson 03)", partial(train_dp_row, "naive")),
    Row("DP bucketed (lesson 03)", partial(train_dp_row, "bucketed")),
    Row("DP overlapped (lesson 03)", partial(train_dp_row, "overlapped")),
    Row("torch DDP", partial(train_dp_row, DDP)),
    # tp = every rank of the job; sequence parallelism also needs tp to divide seq_len
    *[Row(name, partial(train_tp_row, variant),
          check=lambda cfg, n: check_tp(cfg.model, n, sequence_parallel=True))
      for name, variant in [("TP (lesson 04)", "tp"), ("TP + SP (lesson 04)", "tp+sp"),
                            ("DTensor TP", "dtensor")]],
    *[Row(name, partial(train_zero_row, variant)) for name, variant in [
        ("ZeRO stage 1 (lesson 05)", "stage 1"), ("ZeRO stage 2 (lesson 05)", "stage 2"),
        ("ZeRO stage 3 (lesson 05)", "stage 3"),
        ("ZeRO stage 2 + offload (lesson 05: ZeRO-Offload)", "stage 2 + offload"),
        ("ZeRO stage 3 + offload (lesson 05)", "stage 3 + offload"),
        ("torch ZeroRedundancyOptimizer", "ZeroRedundancyOptimizer"),
        ("torch FSDP2", "FSDP2")]],
    # 2 stages (the tour's GPT has 2 blocks) x the remaining ranks as data-parallel copies
    Row("PP GPipe (lesson 06)", partial(train_pp_row, "GPipe")),
    Row("PP 1F1B (lesson 06)", partial(train_pp_row, "1F1B")),
    Row("PP ZB-H1 (lesson 06)", partial(train_pp_row, "ZB-H1")),
    # v = 2 chunks per rank need 2 x pp blocks: a deeper GPT, with its own one-process reference.
    # Its 4 blocks give AdamW more near-zero gradients whose fp32 rounding it turns into steps:
    # 1.1e-5 measured at 4 ranks (the same run in float64: 3.5e-15), so 1e-4 here.
    Row("PP interleaved 1F1B v=2 (lesson 06, deeper GPT)", train_interleaved_row,
        tolerance=1e-4),
    Row("torch pipelining 1F1B", partial(train_pp_row, TORCH)),
    # a rank grid, one strategy per axis: 4 ranks for the 2-D grids, 8 for dp x tp x pp
    *[Row(name, partial(train_grid_row, name), check=partial(check_grid_row, name))
      for name in PLANS],
    # cp = every rank of the job; each rank holds s/cp tokens of every sequence
    *[Row(name, partial(train_cp_row, method), check=partial(check_cp_row, method))
      for name, method in METHOD_ROWS.items()],
    # ep = every rank of the job, also its data-parallel group: E/ep experts each, dense replicated
    Row("EP + DP (lesson 09, MoE GPT)", train_ep_row, check=check_ep_row),
]


def run(world_size=4, steps=5, backend="auto", rows=None, out=print):
    """Run every row; print the table with `out` and return it as a list of dicts."""
    backend, why = backends.choose(backend, world_size)
    cfg = TourConfig(steps=steps, cuda=backend == "nccl")
    if cfg.global_batch % world_size:
        raise ValueError(f"--world-size {world_size} does not divide the global batch of "
                         f"{cfg.global_batch} sequences; use 1, 2, 4, 8 or 16 ranks")
    out(f"dlcourse tour: GPT of {count_params(cfg.model):,} parameters, {steps} AdamW steps, global batch "
        f"{cfg.global_batch}; {world_size} ranks on {backend}" + (f" ({why})" if why else ""))
    table, reference = [], None
    with tqdm(_runnable(rows or ROWS, cfg, world_size, out), desc="strategies", unit="row",
              leave=False) as progress:
        for row in progress:
            progress.set_postfix_str(row.name)
            result = _run_row(row, cfg, world_size, backend)
            reference = reference or result.params
            table.append(_summarise(row, result, reference, world_size if row.distributed else 1))
    out(format_table(table))
    return table


def _runnable(rows, cfg, world_size, out):
    """The rows this many ranks can run; each other one is named with the reason, not run."""
    runnable = []
    for row in rows:
        try:
            if row.check:
                row.check(cfg, world_size)
            runnable.append(row)
        except ValueError as error:
            out(f"skipped {row.name} at {world_size} ranks: {error}")
    return runnable


def _run_row(row, cfg, world_size, backend):
    if not row.distributed:
        return row.train(cfg)
    results = dlcourse.launch(row.train, cfg, world_size=world_size, backend=backend, timeout=600)
    first = results[0]
    first.state_bytes = max(r.state_bytes for r in results)
    if first.activation_bytes is not None:  # the busiest rank: a pipeline's first stage
        first.activation_bytes = max(r.activation_bytes for r in results)
    return first


def _summarise(row, result, reference, ranks):
    reference = result.reference or reference  # a row on a deeper GPT brings its own
    diff = max((result.params[k] - reference[k]).abs().max().item() for k in reference)
    return {
        "strategy": row.name,
        "ranks": ranks,
        "final loss": result.loss,
        "max |Δ| vs reference": diff,
        "matches": diff <= row.tolerance,
        "model-state bytes/rank": result.state_bytes,
        "activation bytes (busiest rank)": result.activation_bytes,
        "comm bytes/step/rank": result.comm_bytes,
        "step time (ms)": 1000 * result.step_time,
    }


def format_table(table):
    def cell(key, value):
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "NO"
        if key.startswith("max"):
            return f"{value:.1e}"
        if isinstance(value, float):
            return f"{value:.4f}" if key == "final loss" else f"{value:.1f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    keys = list(table[0])
    rows = [[cell(k, r[k]) for k in keys] for r in table]
    widths = [max(len(k), *(len(r[i]) for r in rows)) for i, k in enumerate(keys)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(r) for r in rows])


