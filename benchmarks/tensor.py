"""Tensor parallelism from scratch against DTensor: step time of each (lesson 04).

One job of 4 gloo ranks (tp = 4) trains the same course GPT made tensor-parallel both ways,
side by side (`dlcourse.parallel.tensor.compare.time_variants`: rounds in rotating order, the
first a warm-up), and prints each one's median AdamW step time and the ratio from scratch / DTensor.
Target: at most 1.0. Both make the same collectives of the same bytes (counted in
`tests/test_tensor_parallel_dtensor.py`); DTensor adds its dispatch (sharding propagation and
redistribution planning per operator), which the from-scratch layers do not have.

    python benchmarks/tensor.py [--rounds 10] [--batch 8] [--sequence-parallel]

Timings are only comparable within one run: other work on the machine slows every variant,
which is why they take turns, step by step.
"""

import argparse

import torch.distributed as dist

import dlcourse
from dlcourse.memory import count_params
from dlcourse.models import GPT, GPTConfig, synthetic_tokens
from dlcourse.parallel.tensor import check_tp
from dlcourse.parallel.tensor.compare import time_variants

WORLD_SIZE = 4
CONFIG = GPTConfig(vocab_size=512, seq_len=64, n_layers=4, n_heads=8, hidden=256)  # 3.3M params
TARGET = 1.0  # from scratch / DTensor, at most


def benchmark_job(batch, rounds, steps, sequence_parallel):
    variants = ("tp+sp", "dtensor+sp") if sequence_parallel else ("tp", "dtensor")
    data = synthetic_tokens(batch, CONFIG, seed=1)  # the whole batch on every rank
    seconds = time_variants(lambda: GPT(CONFIG, seed=0), data, dist.group.WORLD, variants,
                            rounds=rounds, steps=steps)
    return dict(zip(("from scratch", "DTensor"), (seconds[v] for v in variants)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds (plus one warm-up)")
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    parser.add_argument("--sequence-parallel", action="store_true", help="TP + SP, both ways")
    args = parser.parse_args()
    check_tp(CONFIG, WORLD_SIZE, args.sequence_parallel)
    print(f"GPT of {count_params(CONFIG) / 1e6:.1f}M parameters, batch {args.batch} x "
          f"{CONFIG.seq_len} tokens, tp = {WORLD_SIZE} ranks on gloo"
          + (" with sequence parallelism" if args.sequence_parallel else "")
          + f", {args.rounds} rounds x {args.steps} steps per variant")
    seconds = dlcourse.launch(benchmark_job, args.batch, args.rounds, args.steps,
                              args.sequence_parallel, world_size=WORLD_SIZE, backend="gloo",
                              timeout=600)[0]
    for name, s in seconds.items():
        print(f"{name:<13} {1000 * s:8.1f} ms/step")
    ratio = seconds["from scratch"] / seconds["DTensor"]
    print(f"\nfrom scratch / DTensor = {ratio:.2f}: " + ("meets" if ratio <= TARGET else "MISSES")
          + f" the target of {TARGET}")


if __name__ == "__main__":
    main()
