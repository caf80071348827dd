"""Lesson 11's kill-and-resume job under torchrun, which restarts every worker when one dies:

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m dlcourse.checkpoint.torchrun_job \\
        --root /tmp/ckpt --steps 7 --every 3 --kill 1,5 --out /tmp/params.pt

Each worker runs `failures.train_job` (the same function the notebook launches); on the first
attempt (TORCHELASTIC_RESTART_COUNT 0, set by torchrun) rank 1 SIGKILLs itself before step 6.
torchrun sees a worker gone, stops the others and starts them all again (one restart of the
--max-restarts allowed); they load the newest checkpoint and finish. Rank 0 saves the whole
parameters and the step it resumed from to --out.
"""

import argparse
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from dlcourse.checkpoint.failures import train_job
from dlcourse.checkpoint.run import RunConfig


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="folder of the checkpoints")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--kill", default=None, help="rank,step: that rank dies before step+1")
    parser.add_argument("--out", required=True, help="file for rank 0's parameters")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    kill = tuple(map(int, args.kill.split(","))) if args.kill and attempt == 0 else None
    # a worker whose peer died stops waiting within a minute (gloo's default is 30) instead of
    # outliving torchrun: the course leaves no process behind
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        os.makedirs(args.root, exist_ok=True)
        resumed, params, _ = train_job(args.root, RunConfig(), args.steps, args.every, kill=kill)
        if dist.get_rank() == 0:
            torch.save({"attempt": attempt, "resumed_from": resumed, "params": params}, args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
