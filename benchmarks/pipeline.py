"""Pipeline parallelism from scratch against torch.distributed.pipelining: step time (lesson 06).

One job of 4 gloo ranks cuts the same GPT into the same 4 stages (`cut_stages`) twice: once run
by our executor with the from-scratch 1F1B schedule (`train_step(..., one_f_one_b, ...)`), once
wrapped in torch's `PipelineStage` and run by `Schedule1F1B`. The two take turns, step by step,
in rotating order (first round a warm-up), and the benchmark prints each one's median SGD step
time and ours over torch's. Target: at most 1.05.

    python benchmarks/pipeline.py [--micro-batches 8] [--rounds 10]

Timings are only comparable within one run: other work on the machine slows both, which is why
they take turns. 4 ranks on fewer than 4 cores share them: the ratio still compares the two
implementations, the absolute times do not measure a pipeline.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.memory import count_params
from dlcourse.models import GPT, GPTConfig, synthetic_tokens
from dlcourse.parallel.pipeline import cut_stages, one_f_one_b, split_micro_batches, train_step
from dlcourse.parallel.pipeline.torch_api import torch_schedule, torch_train_step

WORLD_SIZE = 4
CONFIG = GPTConfig(vocab_size=128, seq_len=64, n_layers=8, n_heads=4, hidden=128)  # 1.6M params
BATCH = 32  # sequences per step
TARGET = 1.05  # from scratch / torch, at most


def benchmark_job(n_micro, rounds):
    x, y = synthetic_tokens(BATCH, CONFIG, seed=1)
    ours, theirs = cut_stages(GPT(CONFIG, seed=0)), cut_stages(GPT(CONFIG, seed=0))
    opt_ours = torch.optim.SGD([p for s in ours for p in s.parameters()], lr=1e-3)
    opt_theirs = torch.optim.SGD([p for s in theirs for p in s.parameters()], lr=1e-3)
    schedule = torch_schedule("1F1B", theirs, n_micro)
    micro = split_micro_batches(x, y, n_micro)
    steps = {
        "from scratch": lambda: train_step(ours, opt_ours, one_f_one_b, micro),
        "torch": lambda: torch_train_step(schedule, theirs, opt_theirs, x, y),
    }
    times = {name: [] for name in steps}
    for r in range(rounds + 1):
        for name in list(steps)[r % 2:] + list(steps)[:r % 2]:  # rotate who goes first
            dist.barrier()
            start = time.perf_counter()
            steps[name]()
            dist.barrier()  # a pipeline step ends when its last rank is done
            if r:  # round 0 warms up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=8, help="m, micro-batches per step")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (plus one warm-up)")
    args = parser.parse_args()
    if BATCH % args.micro_batches:
        parser.error(f"--micro-batches must divide the batch of {BATCH} sequences")
    print(f"GPT of {count_params(CONFIG) / 1e6:.1f}M parameters in {WORLD_SIZE} stages, batch "
          f"{BATCH} in {args.micro_batches} micro-batches, 1F1B, {WORLD_SIZE} ranks on gloo, "
          f"{args.rounds} rounds")
    seconds = dlcourse.launch(benchmark_job, args.micro_batches, args.rounds,
                              world_size=WORLD_SIZE, backend="gloo", timeout=600)[0]
    for name, s in seconds.items():
        print(f"{name:<13} {1000 * s:8.1f} ms/step")
    ratio = seconds["from scratch"] / seconds["torch"]
    print(f"\nfrom scratch / torch Schedule1F1B = {ratio:.2f}: "
          + ("meets" if ratio <= TARGET else "MISSES") + f" the target of {TARGET}")


if __name__ == "__main__":
    main()
