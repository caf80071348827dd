"""A rank dies mid-run; the job restarts and every rank goes on from the last checkpoint (lesson 11,
`lessons/11_checkpoints.ipynb`).

    outcome = run_with_restarts(root, RunConfig(), total_steps=8, every=3, kill=(1, 5))

`train_job` is what each rank runs, started afresh on every attempt: build the run, load the
newest complete checkpoint under `root` if there is one (`files.latest`), train to `total_steps`,
saving every `every` steps. `kill=(rank, step)` makes that rank SIGKILL itself before training
step `step + 1` on the first attempt (a machine gone: no exception, no cleanup); the launcher sees
the rank vanish, stops the others, raises `RankError`, and `run_with_restarts` launches the job
again, as `torchrun --max-restarts` restarts its workers. `kill_in_save=(rank, step)` kills the
rank in the middle of the save of step `step`, after its file is written and before the commit.
`forget=("rng",)` makes every resume leave those pieces out (`resume.restore`): a broken resume,
for the tour's row and its test to catch. Each rank appends every step it finishes to a progress
file, so the steps redone are counted, not assumed.
"""

import os
import signal
from dataclasses import dataclass

import torch.distributed as dist

import dlcourse
from dlcourse.checkpoint.files import latest, load_rank_state, save_checkpoint
from dlcourse.checkpoint.resume import restore, resume_state
from dlcourse.checkpoint.run import TrainRun
from dlcourse.errors import RankError


def _die():
    os.kill(os.getpid(), signal.SIGKILL)  # no exception, no atexit, no flush: as a lost node


def train_job(root, cfg, total_steps, every, kill=None, kill_in_save=None, forget=()):
    """On every rank: resume from the newest checkpoint under `root` (or start), train to
    `total_steps`; returns (the step it resumed from, {name: whole parameter}, losses)."""
    group = dist.group.WORLD
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    run = TrainRun(cfg, group)
    path = latest(root)
    if path is not None:
        restore(run, load_rank_state(path, rank, world_size), forget)
    resumed_from, losses = run.steps_done, []
    while run.steps_done < total_steps:
        if kill == (rank, run.steps_done):
            _die()
        losses.append(run.step())
        with open(os.path.join(root, f"progress_rank{rank}.txt"), "a") as f:
            f.write(f"{run.steps_done}\n")
        if run.steps_done % every == 0:
            crash = (lambda r: _die() if r == kill_in_save[0] else None) \
                if kill_in_save and kill_in_save[1] == run.steps_done else None
            save_checkpoint(root, run.steps_done, resume_state(run), group,
                            crash_before_commit=crash)
    return resumed_from, run.full_parameters(), losses


@dataclass
class Outcome:
    results: list  # per rank: (step resumed from, whole parameters, losses of the last attempt)
    restarts: int  # attempts that failed before the one that finished
    failures: list  # one line per failed attempt: which rank, how
    steps_run: int  # steps rank 0 trained over every attempt (from its progress file)
    total_steps: int

    @property
    def redone(self):
        """Steps trained twice: run before a failure, lost, and run again after the restart."""
        return self.steps_run - self.total_steps


def run_with_restarts(root, cfg, total_steps, every, kill=None, kill_in_save=None,
                      max_restarts=3, world_size=2, timeout=120, forget=(), backend="auto"):
    """Launch `train_job` until an attempt finishes (at most max_restarts restarts). The kills
    happen on the first attempt only: a machine that failed is replaced."""
    os.makedirs(root, exist_ok=True)
    failures = []
    for attempt in range(max_restarts + 1):
        plan = dict(kill=kill, kill_in_save=kill_in_save) if attempt == 0 else {}
        try:
            results = dlcourse.launch(train_job, root, cfg, total_steps, every, **plan,
                                      forget=forget, world_size=world_size, backend=backend,
                                      timeout=timeout)
        except RankError as error:
            failures.append(f"attempt {attempt}: rank {error.rank} {error.failures.get(error.rank)}")
            continue
        with open(os.path.join(root, "progress_rank0.txt")) as f:
            steps_run = len(f.read().split())
        return Outcome(results, attempt, failures, steps_run, total_steps)
    raise RuntimeError(f"the job failed {max_restarts + 1} times: {failures[-1]}; raise "
                       "max_restarts or look at the failures")
