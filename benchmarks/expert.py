"""Expert parallelism from scratch against torch's all_to_all_single_autograd and grouped GEMM,
and against one process: step time of each (lesson 09).

One job of 4 gloo ranks (ep = 4, the EP group being the DP group) trains the same MoE GPT
every way side by side (`dlcourse.parallel.expert.compare.time_variants`: rounds in rotating
order, the first a warm-up) and prints each one's median AdamW step time and its ratio to the
from-scratch dispatch with the expert loop. "one process" is rank 0 training on the whole batch
alone while the other ranks wait in a barrier. float32 (`F.grouped_mm` takes no float64).

    python benchmarks/expert.py [--rounds 5] [--batch 8]

No target: on CPU the all-to-alls go through gloo's TCP loopback, and with 4 ranks on a machine
of fewer cores the ranks queue for the cores, so the parallel step can be slower than one
process. Timings are only comparable within one run; on a loaded machine (this course's test
machine has 2 cores shared with other work) every figure is distorted, which the output says.
"""

import argparse
import os

import torch.distributed as dist

import dlcourse
from dlcourse.backends import cpu_cores
from dlcourse.models import MoEConfig, MoEGPT, synthetic_tokens
from dlcourse.parallel.expert import check_ep
from dlcourse.parallel.expert.compare import ONE_PROCESS, VARIANTS, time_variants

WORLD_SIZE = 4
CONFIG = MoEConfig(vocab_size=512, seq_len=64, n_layers=4, n_heads=8, hidden=128, n_experts=8,
                   top_k=2)
BASELINE = "scratch, loop"


def benchmark_job(batch, rounds, steps):
    data = synthetic_tokens(batch, CONFIG, seed=1)
    return time_variants(CONFIG, data, dist.group.WORLD, rounds=rounds, steps=steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="sequences per step, all ranks")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (plus one warm-up)")
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    args = parser.parse_args()
    check_ep(CONFIG, WORLD_SIZE)
    model = MoEGPT(CONFIG)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for m in model.moe_layers() for p in m.experts.parameters())
    print(f"MoE GPT of {total / 1e6:.2f}M parameters ({experts / 1e6:.2f}M in {CONFIG.n_experts} "
          f"experts x {len(CONFIG.moe_blocks)} blocks, top-{CONFIG.top_k}), batch {args.batch} x "
          f"{CONFIG.seq_len} tokens, ep = {WORLD_SIZE} ranks on gloo, {args.rounds} rounds x "
          f"{args.steps} steps per variant")
    seconds = dlcourse.launch(benchmark_job, args.batch, args.rounds, args.steps,
                              world_size=WORLD_SIZE, backend="gloo", timeout=600)[0]
    print(f"{'variant':<24} {'ms/step':>8} {'/ ' + BASELINE:>16}")
    for name in (*VARIANTS, ONE_PROCESS):
        print(f"{name:<24} {1000 * seconds[name]:8.1f} {seconds[name] / seconds[BASELINE]:16.2f}")
    load = os.getloadavg()[0]
    print(f"\n{WORLD_SIZE} ranks on {cpu_cores()} cores, load average {load:.1f}: "
          + ("the ranks share cores with each other and with other work, so these timings are "
             "distorted; compare them only with each other" if load > 1 or cpu_cores() < WORLD_SIZE
             else "the ranks had the cores to themselves"))


if __name__ == "__main__":
    main()
