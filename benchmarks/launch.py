"""Launch overhead: dlcourse.launch against torch.multiprocessing.spawn (lesson 00).

The job is the same for both: 4 ranks on gloo, one all-reduce of one element, results back.
  cold: the first launch in a fresh interpreter (dlcourse starts its forkserver, which imports
        torch; spawn starts 4 interpreters that each import torch)
  warm: a later launch from the same interpreter (what a notebook does from cell to cell)
Each measurement runs in a fresh interpreter, dlcourse and spawn taking turns, and the table
shows medians. Targets: warm <= 0.1 of spawn, cold <= 0.5.

    python benchmarks/launch.py [--rounds 3] [--warm 5]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing

import dlcourse

WORLD_SIZE = 4
TARGETS = {"cold": 0.5, "warm": 0.1}  # dlcourse time / spawn time, at most


def all_reduce_job():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _spawn_rank(rank, port, results):
    torch.set_num_threads(1)  # what dlcourse gives each rank on this machine, for fairness
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD_SIZE)
    results[rank] = all_reduce_job()
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_once():
    results = torch.multiprocessing.get_context("spawn").Manager().dict()
    torch.multiprocessing.spawn(_spawn_rank, args=(_free_port(), results), nprocs=WORLD_SIZE)
    return [results[r] for r in range(WORLD_SIZE)]


def launch_once():
    return dlcourse.launch(all_reduce_job, world_size=WORLD_SIZE, backend="gloo")


def measure(method, launches):
    """In this (fresh) interpreter: seconds for each of `launches` launches, first = cold."""
    run = {"dlcourse": launch_once, "spawn": spawn_once}[method]
    times = []
    for _ in range(launches):
        start = time.perf_counter()
        assert run() == [float(WORLD_SIZE)] * WORLD_SIZE
        times.append(time.perf_counter() - start)
    return times


def _in_fresh_interpreter(method, launches):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--measure", method, "--warm", str(launches - 1)],
                         capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="fresh interpreters per method")
    parser.add_argument("--warm", type=int, default=5, help="warm launches per interpreter")
    parser.add_argument("--measure", choices=["dlcourse", "spawn"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # child mode: print the times as JSON
        print(json.dumps(measure(args.measure, 1 + args.warm)))
        return 0
    times = {"dlcourse": {"cold": [], "warm": []}, "spawn": {"cold": [], "warm": []}}
    for _ in range(args.rounds):
        for method in ("dlcourse", "spawn"):
            # spawn's warm launches cost as much as cold ones; two per interpreter are enough
            t = _in_fresh_interpreter(method, 1 + (args.warm if method == "dlcourse" else 2))
            times[method]["cold"].append(t[0])
            times[method]["warm"].extend(t[1:])
    print(f"4-rank gloo all-reduce job, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
          f"medians of {args.rounds} fresh interpreters")
    print(f"{'launch':<6} {'dlcourse (s)':>13} {'spawn (s)':>10} {'ratio':>7} {'target':>7}  ok")
    failed = False
    for kind in ("cold", "warm"):
        ours, theirs = (statistics.median(times[m][kind]) for m in ("dlcourse", "spawn"))
        ratio = ours / theirs
        failed |= ratio > TARGETS[kind]
        print(f"{kind:<6} {ours:>13.3f} {theirs:>10.3f} {ratio:>7.3f} {TARGETS[kind]:>7.2f}  "
              f"{'yes' if ratio <= TARGETS[kind] else 'NO'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
