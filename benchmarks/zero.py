"""ZeRO from scratch against data parallelism and torch's FSDP2: step time and peak bytes (lesson 05).

One job of 4 gloo ranks trains the same course GPT with lesson 03's DataParallel, ZeRO stages
1, 2, 3 (dlcourse.parallel.zero) and FSDP2 (`fully_shard` per Block), side by side: all built
first, then rounds in rotating order, every one taking `--steps` AdamW steps per round (the first
round a warm-up). Prints each stage's median step time over DP's, stage 3's over FSDP2's, and
the peak bytes held during a step by the rank that needs most, for every variant (every
allocation counted, `zero.measure.step_peak`, median of 3 steps; DP and stages 1, 2 with 1 MB
buckets, so that stage 2 sends its gradients in several pieces during backward).
Targets (issue 18): stage 3 at most 1.1x FSDP2's step time, and peak bytes at most FSDP2's.

    python benchmarks/zero.py [--rounds 10] [--steps 1]

Timings are only comparable within one run: other work on the machine slows every variant,
which is why they take turns.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.memory import count_params
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.compare import wrap
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.zero import ZeroAdamW, zero
from dlcourse.parallel.zero.measure import held_bytes, step_peak
from dlcourse.parallel.zero.torch_api import fsdp2, fsdp2_held_bytes

WORLD_SIZE = 4
CONFIG = GPTConfig(vocab_size=256, seq_len=64, n_layers=4, n_heads=4, hidden=128)
GLOBAL_BATCH = 16
BUCKET_CAP_MB = 1.0  # DP and stages 1, 2: 4 buckets of this 3.4 MB model (25 MB would make one)
TIME_TARGET = 1.1  # stage 3 / FSDP2, at most
NAMES = ["DP", "stage 1", "stage 2", "stage 3", "FSDP2"]


def build(name, group):
    model = GPT(CONFIG, seed=0)
    if name == "DP":
        model = wrap("overlapped", model, group, bucket_cap_mb=BUCKET_CAP_MB)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if name == "FSDP2":
        return fsdp2(model, group, lr=1e-3)
    stage = int(name[-1])
    model = zero(stage, model, group, **({"bucket_cap_mb": BUCKET_CAP_MB} if stage < 3 else {}))
    return model, ZeroAdamW(model, lr=1e-3)


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    lm_loss(model(x), y).backward()
    optimizer.step()


def benchmark_job(rounds, steps):
    group = dist.group.WORLD
    x, y = shard_batch(synthetic_tokens(GLOBAL_BATCH, CONFIG, seed=1), group)
    built = {name: build(name, group) for name in NAMES}
    times = {name: [] for name in NAMES}
    for r in range(rounds + 1):
        for name in NAMES[r % len(NAMES):] + NAMES[:r % len(NAMES)]:
            for _ in range(steps):
                start = time.perf_counter()
                step(*built[name], x, y)
                if r:  # round 0 warms up
                    times[name].append(time.perf_counter() - start)
    peaks = {name: peak_of(name, *built[name], x, y) for name in NAMES}
    return {name: statistics.median(t) for name, t in times.items()}, peaks


def peak_of(name, model, optimizer, x, y, steps=3):
    """Median peak bytes over `steps` steps on this rank. The profiler also counts what gloo's
    worker threads allocate, at moments that vary from run to run (up to a unit's bytes)."""
    held = fsdp2_held_bytes if name == "FSDP2" else held_bytes  # FSDP2's shards are DTensors
    return statistics.median(step_peak(model, optimizer, x, y, held)[0] for _ in range(steps))


def table(seconds, peaks):
    lines = [f"{'variant':<8} {'ms/step':>8} {'/ DP':>6} {'peak bytes':>12}", "-" * 37]
    for name in NAMES:
        lines.append(f"{name:<8} {1000 * seconds[name]:8.1f} {seconds[name] / seconds['DP']:6.2f} "
                     f"{peaks[name]:12,.0f}")
    ratio = seconds["stage 3"] / seconds["FSDP2"]
    lines.append(f"\nstage 3 / FSDP2 step time = {ratio:.2f}: "
                 + ("meets" if ratio <= TIME_TARGET else "MISSES") + f" the target of {TIME_TARGET}")
    mine, theirs = peaks["stage 3"], peaks["FSDP2"]
    lines.append(f"peak bytes per rank: stage 3 {mine:,.0f}, FSDP2 {theirs:,.0f}, ratio "
                 f"{mine / theirs:.3f}: " + ("meets" if mine <= theirs else "MISSES")
                 + " the target (at most FSDP2's)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (plus one warm-up)")
    parser.add_argument("--steps", type=int, default=1, help="steps per variant per round")
    args = parser.parse_args()
    print(f"course GPT of {count_params(CONFIG):,} parameters, global batch {GLOBAL_BATCH}, "
          f"{WORLD_SIZE} ranks on gloo, {args.rounds} rounds x {args.steps} steps per variant")
    results = dlcourse.launch(benchmark_job, args.rounds, args.steps, world_size=WORLD_SIZE,
                              backend="gloo", timeout=600)
    seconds = results[0][0]  # rank 0's clock; the ranks step together
    peaks = {name: max(r[1][name] for r in results) for name in results[0][1]}  # the worst rank
    print(table(seconds, peaks))


if __name__ == "__main__":
    main()
