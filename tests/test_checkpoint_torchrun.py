"""Lesson 11's recipe: `torchrun --max-restarts 1` restarts the workers after rank 1 is SIGKILLed,
and the job ends equal to one that never failed (dlcourse/checkpoint/torchrun_job.py)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from dlcourse.checkpoint import RunConfig
from dlcourse.checkpoint.failures import run_with_restarts
from dlcourse.checkpoint.torchrun_job import recipe

ROOT = Path(__file__).resolve().parents[1]
STEPS, EVERY, KILL_RANK, KILL_STEP = 7, 3, 1, 5


def clean_env():
    """The test's environment minus anything a launcher or another test set: torchrun sets its
    workers' own, and this repository's dlcourse is the one imported."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TORCHELASTIC_") and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "MASTER_ADDR", "MASTER_PORT")}
    return dict(env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def descendants(pid):
    """Every process below `pid`. torchrun starts each worker in a session of its own
    (elastic/multiprocessing/subprocess_handler: start_new_session=True), so killing torchrun's
    process group does not reach them: they are found by parent and killed by id."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            frontier += children
    return found


def start(argv):
    """The recipe in a process group of its own, its output piped back."""
    return subprocess.Popen(argv, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc, timeout):
    """(exit code, output); past `timeout` seconds kill torchrun and every worker, and fail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        for pid in descendants(proc.pid):  # the workers first: they outlive torchrun otherwise
            os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun ran past {timeout} s; its output:\n{out[-3000:]}")


def test_torchrun_restarts_a_killed_worker_and_the_run_ends_equal(tmp_path):
    out = tmp_path / "params.pt"
    argv = recipe(tmp_path / "ckpt", out, STEPS, EVERY, f"{KILL_RANK},{KILL_STEP}")
    assert argv[0] == "torchrun"  # the console script is torch.distributed.run's main
    proc = start([sys.executable, "-m", "torch.distributed.run", *argv[1:]])
    try:  # the run that never failed, while torchrun's agent waits on its workers
        ref = run_with_restarts(str(tmp_path / "ref"), RunConfig(), STEPS, EVERY).results[0][1]
    finally:
        code, log = finish(proc, timeout=120)
    assert code == 0, log[-3000:]
    got = torch.load(out, weights_only=True)
    last_save = KILL_STEP // EVERY * EVERY  # step 3: the newest checkpoint before the kill
    assert got["attempt"] == 1 and got["resumed_from"] == last_save
    steps_run = len((tmp_path / "ckpt" / "progress_rank0.txt").read_text().split())
    assert steps_run - STEPS == KILL_STEP - last_save  # steps 4 and 5 trained twice
    assert ref.keys() == got["params"].keys()
    for name, whole in ref.items():  # float64, the same steps in the same order: every bit
        assert whole.dtype == torch.float64 and torch.equal(got["params"][name], whole), name
