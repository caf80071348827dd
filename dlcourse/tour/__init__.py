"""`dlcourse tour`: the whole course in one table.

Trains the course GPT with every strategy of the catalogue (`dlcourse.strategies`), each on real
ranks, checks each against the single-process reference, and prints: strategy, final loss, max
difference from the reference, model-state bytes per rank, the activation bytes of the busiest
rank ("-" where lesson 01's saved-tensor log cannot key a strategy's parameters: DTensor, FSDP2,
torch's ZeRO), communication bytes per step, step time.

A row is a catalogue entry with `tour=True`; one runner (`rows.py`) trains and measures every
one the same way, and every row of the chosen world size runs in one job (one launch: the ranks
start once). A row that cannot run on that many ranks (tp must divide the heads; Ulysses' cp
too; ep must divide the experts) says why and is left out; one that needs another world size (a
lesson 07 grid of 8 ranks) says which. A row that would break a shared job (lesson 11's, which
kills a rank) declares `own_job`: it runs after that job in launches of its own, at its own world
size, and its note (restarts, steps redone, launches) is printed under the table.
"""

from tqdm.auto import tqdm

import dlcourse
from dlcourse import backends
from dlcourse.memory import count_params
from dlcourse.strategies import MATCH_TOLERANCE, STRATEGIES, NeedsRanks, TourConfig
from dlcourse.strategies.trainer import RowResult
from dlcourse.tour.rows import run_rows, train_reference

REFERENCE = "single process (reference)"
ROWS = [s for s in STRATEGIES if s.tour]

__all__ = ["MATCH_TOLERANCE", "REFERENCE", "ROWS", "RowResult", "TourConfig", "format_table", "run"]


def run(world_size=4, steps=5, backend="auto", rows=None, out=print):
    """Run every row; print the table with `out` and return it as a list of dicts."""
    backend, why = backends.choose(backend, world_size)
    cfg = TourConfig(steps=steps, cuda=backend == "nccl")
    if cfg.global_batch % world_size:
        raise ValueError(f"--world-size {world_size} does not divide the global batch of "
                         f"{cfg.global_batch} sequences; use 1, 2, 4, 8 or 16 ranks")
    out(f"dlcourse tour: GPT of {count_params(cfg.model):,} parameters, {steps} AdamW steps, global batch "
        f"{cfg.global_batch}; {world_size} ranks on {backend}" + (f" ({why})" if why else ""))
    runnable = _runnable(ROWS if rows is None else rows, cfg, world_size, out)
    shared = [row for row in runnable if row.own_job is None]
    own = [row for row in runnable if row.own_job is not None]
    with tqdm(total=len(runnable) + 1, desc="strategies", unit="row", leave=False) as progress:
        reference = train_reference(cfg)
        progress.update()
        per_rank = dlcourse.launch(run_rows, shared, cfg, world_size=world_size,
                                   backend=backend, timeout=600) if shared else []
        progress.update(len(shared))
        results = [_busiest([results[i] for results in per_rank]) for i in range(len(shared))]
        for row in own:  # after the shared job: a row that kills a rank must not stop it
            results.append(row.own_job(cfg))
            progress.update()
    table = [_summarise(REFERENCE, MATCH_TOLERANCE, reference, reference.params, 1)]
    for row, result in zip(shared + own, results):
        table.append(_summarise(row.name, row.tolerance, result, reference.params,
                                row.ranks if row.own_job else world_size))
        if result.note:
            table[-1]["note"] = result.note  # printed under the table, not a column
    out(format_table(table))
    for row in table:
        if row.get("note"):
            out(f"note: {row['strategy']}: {row['note']}")
    return table


def _runnable(rows, cfg, world_size, out):
    """The rows this many ranks can run; each other one is named with the reason, not run."""
    runnable = []
    for row in rows:
        try:
            row.check(cfg, world_size)
            runnable.append(row)
        except NeedsRanks as needs:
            out(f"not run: {row.name} {needs}")
        except ValueError as error:
            out(f"skipped {row.name} at {world_size} ranks: {error}")
    return runnable


def _busiest(results):
    """Rank 0's result, with the most state and activation bytes any rank held (a pipeline's
    first stage holds the most activations)."""
    first = results[0]
    first.state_bytes = max(r.state_bytes for r in results)
    if first.activation_bytes is not None:
        first.activation_bytes = max(r.activation_bytes for r in results)
    return first


def _summarise(name, tolerance, result, reference, ranks):
    reference = result.reference or reference  # a row on another GPT brings its own
    diff = max((result.params[k] - reference[k]).abs().max().item() for k in reference)
    return {
        "strategy": name,
        "ranks": ranks,
        "final loss": result.loss,
        "max |Δ| vs reference": diff,
        "matches": diff <= tolerance,
        "model-state bytes/rank": result.state_bytes,
        "activation bytes (busiest rank)": result.activation_bytes,
        "comm bytes/step/rank": result.comm_bytes,
        "step time (ms)": None if result.step_time is None else 1000 * result.step_time,
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
