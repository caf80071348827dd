"""Ring attention against K/V by all-gather and against one process: step time (lesson 08).

One job of 2 gloo ranks (cp = 2) times one attention forward + backward of each variant on the
same whole sequence, side by side (`dlcourse.parallel.context.compare.time_attention`: rounds in
rotating order, the first a warm-up, every step between two barriers): ring attention
(contiguous chunks and zig-zag; each block written out, and on torch's fused CPU flash kernel),
K/V by all-gather, and one process's attention over the whole sequence, with torch's SDPA (the
fused kernel) and with this package's arithmetic written out in one block. It also times each
rank's causal compute alone (`compare.causal_compute_seconds`), contiguous and zig-zag, beside
the block pairs `layout.causal_work` counts: the imbalance, measured.

Targets, causal, the same kernel on both sides: zig-zag fused / one process (sdpa) at most 0.75
(of the 16 (s/4)² blocks of scores, a diagonal one counting half, each zig-zag rank computes 4
and one process 8, both skipping the masked ones: 0.5, plus room for the messages and merges),
and zig-zag no slower than the contiguous ring, written out (its ranks share the causal work).

    python benchmarks/context.py [--seq-len 2048] [--rounds 5] [--not-causal]

Timings are only comparable within one run: other work on the machine slows every variant,
which is why they take turns. The two ranks need a core each; with fewer free cores the ratio to
one process says more about the machine than about the ring.
"""

import argparse

import torch.distributed as dist

import dlcourse
from dlcourse.parallel.context import Layout, causal_work
from dlcourse.parallel.context.compare import ONE_PROCESS, causal_compute_seconds, time_attention

CP = 2
VARIANTS = ("ring", "zigzag", "allgather", "ring fused", "zigzag fused", *ONE_PROCESS)
TARGETS = {"zig-zag fused / one process (sdpa)": 0.75,  # causal, at most
           "zig-zag / ring": 1.0}


def benchmark_job(args):
    seconds = time_attention(dist.group.WORLD, VARIANTS, args.batch, args.heads, args.seq_len,
                             args.head_dim, causal=not args.not_causal, rounds=args.rounds)
    rank = dist.get_rank()
    compute = {name: causal_compute_seconds(Layout(name, CP, args.seq_len), rank, args.batch,
                                            args.heads, args.head_dim, repeats=args.rounds)
               for name in ("contiguous", "zigzag")}  # ranks at once, no messages
    return seconds, compute


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048, help="s: tokens in the whole sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (plus one warm-up)")
    parser.add_argument("--not-causal", action="store_true", help="no causal mask")
    args = parser.parse_args()
    try:
        Layout("zigzag", CP, args.seq_len)  # a length 2·cp does not divide, before any rank starts
    except ValueError as error:
        parser.error(str(error))
    causal = "not causal" if args.not_causal else "causal"
    print(f"attention forward + backward, {causal}: batch {args.batch}, {args.heads} heads of "
          f"{args.head_dim}, {args.seq_len} tokens; cp = {CP} gloo ranks, {args.rounds} rounds")
    results = dlcourse.launch(benchmark_job, args, world_size=CP, backend="gloo", timeout=600)
    seconds = results[0][0]
    for name, s in seconds.items():
        print(f"{name:<25} {1000 * s:9.1f} ms")
    print("\ncausal forward compute per rank, no messages (ms), and the block pairs counted:")
    for name in ("contiguous", "zigzag"):
        ms = "  ".join(f"rank {r}: {1000 * out[1][name]:7.1f}" for r, out in enumerate(results))
        print(f"{name:<11} {ms}   pairs {causal_work(Layout(name, CP, args.seq_len))}")
    ratios = {"zig-zag fused / one process (sdpa)": ("zigzag fused", "one process (sdpa)"),
              "ring fused / one process (sdpa)": ("ring fused", "one process (sdpa)"),
              "all-gather / ring": ("allgather", "ring"),
              "zig-zag / ring": ("zigzag", "ring")}
    print()
    for what, (top, bottom) in ratios.items():
        ratio = seconds[top] / seconds[bottom]
        target = TARGETS.get(what) if not args.not_causal else None
        verdict = "" if target is None else (" meets" if ratio <= target else " MISSES") + \
            f" the target of {target}"
        print(f"{what:<36} {ratio:5.2f}{verdict}")

if __name__ == "__main__":
    main()
