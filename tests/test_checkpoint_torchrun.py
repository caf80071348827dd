"""Lesson 11's recipe: `torchrun --max-restarts 1` restarts the workers after rank 1 is SIGKILLed,
and the job ends equal to one that never failed (dlcourse/checkpoint/torchrun_job.py)."""

import os
import subprocess
import sys

import torch

from dlcourse.checkpoint import RunConfig
from dlcourse.checkpoint.failures import run_with_restarts


def test_torchrun_restarts_a_killed_worker_and_the_run_ends_equal(tmp_path):
    out = tmp_path / "params.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--max-restarts", "1", "-m", "dlcourse.checkpoint.torchrun_job", "--root",
           str(tmp_path / "ckpt"), "--steps", "7", "--every", "3", "--kill", "1,5", "--out",
           str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = torch.load(out, weights_only=True)
    assert got["attempt"] == 1 and got["resumed_from"] == 3  # one restart, from step 3's save
    ref = run_with_restarts(str(tmp_path / "ref"), RunConfig(), 7, 3).results[0][1]
    assert all((got["params"][k] - ref[k]).abs().max() == 0 for k in ref)
