"""The course's ring all-reduce against torch's own all_reduce, side by side in one run (lesson 02).

    python benchmarks/collectives.py [--world-size 4] [--repeats 15]

Both run on the same ranks, taking turns within each repeat, so load from elsewhere slows both
alike; the ratio is the median over repeats of (course time / torch time) in the same repeat,
with the quartiles of those ratios beside it. busbw is nccl-tests' bus bandwidth
(`dlcourse.collectives.busbw`). A second table gives CPU seconds of the busiest rank (all its
threads), which a busy machine disturbs less than wall time. Target (issue 5): a time ratio of
at most 1.2 at 16 MB with gloo on CPU.
"""

import argparse
import statistics
import time

import dlcourse
from dlcourse.collectives import busbw
from dlcourse.collectives.measure import time_ops

SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]  # 64 KB .. 64 MB
TARGET = (16 << 20, 1.2)  # at 16 MB, at most 1.2x torch's time
NAMES = ["torch all_reduce", "ring all_reduce"]


def main():
    args = _arguments()
    run = dict(world_size=args.world_size, backend=args.backend, timeout=600)
    wall = dlcourse.launch(time_ops, NAMES, SIZES, args.repeats, summary=list, **run)[0]
    cpu = dlcourse.launch(time_ops, NAMES, SIZES, args.repeats, summary=list,
                          clock=time.process_time, **run)[0]
    print(f"all_reduce of float32 on {args.world_size} ranks ({args.backend}), "
          f"{args.repeats} repeats\n")
    ratios = _table("wall time", wall, args.world_size, bandwidth=True)
    print()
    _table("CPU time of the busiest rank", cpu, args.world_size, bandwidth=False)
    size, limit = TARGET
    verdict = "meets" if ratios[size] <= limit else "misses"
    print(f"\ntarget: ring/torch wall time <= {limit} at {_size(size)}: {ratios[size]:.2f}, "
          f"{verdict} it")


def _table(what, times, world_size, bandwidth):
    """Print one row per size; return {size: median ratio}."""
    header = f"{'size':>7} {'torch ms':>9} {'ring ms':>9} {'ring/torch':>10} {'q1..q3':>11}"
    print(f"{what}\n{header}" + (f" {'torch busbw':>11} {'ring busbw':>11}" if bandwidth else ""))
    ratios = {}
    for j, nbytes in enumerate(SIZES):
        torch_s, ring_s = (times[name][j] for name in NAMES)
        paired = [r / t for r, t in zip(ring_s, torch_s)]
        ratios[nbytes] = statistics.median(paired)
        q1, _, q3 = statistics.quantiles(paired, n=4)
        t, r = statistics.median(torch_s), statistics.median(ring_s)
        line = (f"{_size(nbytes):>7} {t * 1e3:9.2f} {r * 1e3:9.2f} {ratios[nbytes]:10.2f} "
                f"{f'{q1:.2f}..{q3:.2f}':>11}")
        if bandwidth:
            line += (f" {_gbps(busbw('all_reduce', nbytes, t, world_size)):>11}"
                     f" {_gbps(busbw('all_reduce', nbytes, r, world_size)):>11}")
        print(line)
    return ratios


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    # gloo only: `time_ops` times CPU tensors (nccl would need CUDA tensors and synchronizing).
    parser.add_argument("--backend", default="gloo", choices=["gloo"])
    return parser.parse_args()


def _size(nbytes):
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def _gbps(bytes_per_s):
    return f"{bytes_per_s / 1e9:.2f} GB/s"


if __name__ == "__main__":
    main()
