"""Data parallelism from scratch against torch DDP: step time of each variant (lesson 03).

One job of 4 gloo ranks trains the same 4.2M-parameter MLP with every variant side by side
(`dlcourse.parallel.data.compare.time_variants`: rounds in rotating order, first round a warm-up)
and prints each variant's median SGD step time over DDP's. Target: the overlapped variant (the
full from-scratch DataParallel: buckets + overlap) at most 1.05x DDP.

    python benchmarks/data.py [--global-batch 128] [--bucket-cap-mb 4] [--rounds 20]

Both DataParallel and DDP get the same bucket_cap_mb: 4 MiB puts each of the MLP's four
1024 x 1024 layers in its own bucket, in both (counted: `compare.count_step`). At DDP's default
of 25 MiB both hold the whole 16.8 MB in one bucket, and there is nothing to overlap. Timings are
only comparable within one run: other work on the machine slows every variant, which is why
they take turns, step by step.
"""

import argparse

import torch.distributed as dist
import torch.nn.functional as F

import dlcourse
from dlcourse.models import MLP, MLPConfig, synthetic_regression
from dlcourse.parallel.data.compare import DDP, NAMES, time_variants
from dlcourse.parallel.data.steps import shard_batch

WORLD_SIZE = 4
CONFIG = MLPConfig(d_in=1024, hidden=1024, n_layers=3, d_out=1024)  # 4 x (1024^2 + 1024) = 4.2M
TARGET = 1.05  # overlapped / DDP, at most


def benchmark_job(global_batch, bucket_cap_mb, rounds, steps):
    group = dist.group.WORLD
    batch = shard_batch(synthetic_regression(global_batch, CONFIG, seed=1), group)
    return time_variants(lambda: MLP(CONFIG, seed=0), batch, F.mse_loss, group,
                         rounds=rounds, steps=steps, bucket_cap_mb=bucket_cap_mb)


def table(seconds):
    lines = [f"{'variant':<12} {'ms/step':>8} {'/ DDP':>6}", "-" * 28]
    for name in NAMES:
        ratio = seconds[name] / seconds[DDP]
        target = f"  (target <= {TARGET})" if name == "overlapped" else ""
        lines.append(f"{name:<12} {1000 * seconds[name]:8.1f} {ratio:6.2f}{target}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--global-batch", type=int, default=128, help="samples per step, all ranks")
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0, help="MiB per bucket")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (plus one warm-up)")
    parser.add_argument("--steps", type=int, default=1, help="steps per variant per round")
    args = parser.parse_args()
    n_params = sum(p.numel() for p in MLP(CONFIG).parameters())
    print(f"MLP of {n_params / 1e6:.1f}M parameters, global batch {args.global_batch}, "
          f"{WORLD_SIZE} ranks on gloo, bucket_cap_mb={args.bucket_cap_mb:g}, "
          f"{args.rounds} rounds x {args.steps} steps per variant")
    seconds = dlcourse.launch(benchmark_job, args.global_batch, args.bucket_cap_mb, args.rounds,
                              args.steps, world_size=WORLD_SIZE, backend="gloo", timeout=600)[0]
    print(table(seconds))
    ratio = seconds["overlapped"] / seconds[DDP]
    print(f"\noverlapped / DDP = {ratio:.2f}: " + ("meets" if ratio <= TARGET else "MISSES")
          + f" the target of {TARGET}")


if __name__ == "__main__":
    main()
