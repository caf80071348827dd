"""Lesson 11's run as a row of the tour (`lessons/11_checkpoints.ipynb`): a rank killed mid-run,
the job relaunched, every rank resumed from the last checkpoint, and the end compared with the
same run never interrupted (`dlcourse.checkpoint.failures.run_with_restarts`).

It is no `build(cfg, groups)`: a rank that SIGKILLs itself would take every other row of a shared
job with it, so the entry declares `own_job=kill_row` and the tour runs it after the shared job,
in launches of its own (3: the uninterrupted run, the attempt killed, the restart). It trains
lesson 11's `RunConfig` (lesson 04's 2-rank TP GPT, float64, dropout on), not the tour's GPT, for
its own 7 steps, on gloo (its tensors live on the CPU): the tour's --steps, --world-size and
--backend do not change it.
"""

import os
import tempfile
import time

import torch

from dlcourse.strategies.trainer import RowResult

STEPS, EVERY, KILL = 7, 3, (1, 5)  # checkpoints after steps 3 and 6; rank 1 dies before step 6
RANKS = 2  # RunConfig's tensor-parallel size


def kill_row(cfg=None, forget=()):
    """The row's `RowResult`: the run killed and resumed against the run never killed. `forget`:
    pieces every resume leaves out (`checkpoint.resume.PIECES`), a broken resume to catch."""
    # not at the top: the tour and lesson 11's package (through lesson 10's finder) import the
    # catalogue, which imports this module
    from dlcourse.checkpoint.failures import run_with_restarts
    from dlcourse.checkpoint.files import latest
    from dlcourse.checkpoint.run import RunConfig

    with tempfile.TemporaryDirectory(prefix="dlcourse_kill_row_") as root:
        start = time.perf_counter()
        whole = run_with_restarts(os.path.join(root, "whole"), RunConfig(), STEPS, EVERY,
                                  world_size=RANKS, backend="gloo")
        middle = time.perf_counter()
        killed = run_with_restarts(os.path.join(root, "killed"), RunConfig(), STEPS, EVERY,
                                   kill=KILL, world_size=RANKS, forget=forget, backend="gloo")
        end = time.perf_counter()
        state, saved = checkpoint_bytes(latest(os.path.join(root, "killed")))
    _, params, losses = killed.results[0]
    restarts = f"{killed.restarts} restart" + "s" * (killed.restarts != 1)
    note = (f"{restarts}, {killed.redone} steps redone, checkpoint {saved:,} B/rank;"
            f" {STEPS} steps of lesson 11's run (not the tour's), 1 + {killed.restarts + 1} "
            f"launches: {middle - start:.1f} s uninterrupted, {end - middle:.1f} s killed")
    return RowResult(losses[-1], params, state, None, None, reference=whole.results[0][1],
                     note=note)


def checkpoint_bytes(path):
    """(the most model-state bytes a rank holds: its parameters twice, as values and gradients,
    and AdamW's state, read from its checkpoint; the largest rank file's bytes on disk)."""
    from dlcourse.checkpoint.files import rank_file, read_metadata  # see kill_row
    meta = read_metadata(path)
    state = 0
    for rank in range(meta["world_size"]):
        saved = torch.load(os.path.join(path, rank_file(rank)), weights_only=True)
        params = _storage_bytes(saved["model"].values())  # a tied weight saved once, counted once
        adam = _storage_bytes(t for s in saved["optimizer"]["state"].values() for t in s.values()
                              if torch.is_tensor(t))
        state = max(state, 2 * params + adam)
    return state, max(meta["files"].values())


def _storage_bytes(tensors):
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
