"""Context-parallel attention timed beside one process's (lesson 08,
`lessons/08_context_parallel.ipynb`; `benchmarks/context.py` uses it).

    time_attention(group, batch=1, heads=4, seq_len=1024, head_dim=64, rounds=5)
    # {variant: median seconds of one forward + backward}, the same on every rank
    causal_compute_seconds(layout, rank, batch=1, heads=4, head_dim=64)
    # this rank's causal attention compute alone, without messages: the load (im)balance
    pair_seconds([256, 512])
    # one chunk pair and its steps (mask, masked softmax) per size: what a pair costs, and why
    alone_and_together(group)
    # one process's attention on one rank alone, and on every rank at once: core sharing

Variants: "ring", "zigzag", "allgather" and "ulysses" on the group's ranks, each rank holding
s/cp tokens, and "ring fused", "zigzag fused": the ring with torch's fused CPU kernel per block
(`kernels.py`), the kernel SDPA runs. "one process (sdpa)" and "one process (blockwise)" run
the whole sequence on every rank alone (torch's `scaled_dot_product_attention`, and this
package's `block_attention`, the ring's own arithmetic in one block), so they load the machine
as the parallel variants do.
"""

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.parallel.context.blockwise import attention_block, block_attention, visible
from dlcourse.parallel.context.layout import Layout
from dlcourse.parallel.context.parallelize import METHODS

ONE_PROCESS = ("one process (sdpa)", "one process (blockwise)")


def attention_step(variant, q, k, v, group, layout, causal=True):
    """One forward and backward of `variant` on q, k, v (b, a, n, d) that require grad."""
    if variant == "one process (sdpa)":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    elif variant == "one process (blockwise)":
        pos = torch.arange(q.size(2), device=q.device)
        out = block_attention(q, k, v, pos, pos, causal)
    else:
        method, _, kernel = variant.partition(" ")  # "ring fused" -> ring, kernel "fused"
        options = {"kernel": kernel} if kernel else {}
        out = METHODS[method][1](q, k, v, group, layout, causal, **options)
    out.sum().backward()


def _inputs(variant, group, batch, heads, seq_len, head_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    whole = [torch.randn(batch, heads, seq_len, head_dim, generator=gen) for _ in range(3)]
    if variant in ONE_PROCESS:
        return [t.requires_grad_() for t in whole], None
    layout = Layout(METHODS[variant.split()[0]][0], dist.get_world_size(group), seq_len)
    rank = dist.get_rank(group)
    return [layout.shard(t, rank, dim=2).requires_grad_() for t in whole], layout


def time_attention(group, variants=("ring", "allgather", *ONE_PROCESS), batch=1, heads=4,
                   seq_len=1024, head_dim=64, causal=True, rounds=5):
    """Median seconds of one attention forward + backward per variant, in rotating order each
    round (round 0 a warm-up); every step starts and ends at a barrier, so each rank's time is
    the slowest rank's."""
    inputs = {name: _inputs(name, group, batch, heads, seq_len, head_dim) for name in variants}
    times = {name: [] for name in variants}
    for r in range(rounds + 1):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name in order:
            (q, k, v), layout = inputs[name]
            dist.barrier(group=group)
            start = time.perf_counter()
            attention_step(name, q, k, v, group, layout, causal)
            dist.barrier(group=group)
            if r:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def causal_compute_seconds(layout, rank, batch=1, heads=4, head_dim=64, repeats=3):
    """Median seconds of the forward compute rank `rank` does under a causal mask in `layout`:
    its query chunks against every key chunk they may see (the pairs ring attention computes),
    with no communication, so the ranks' shares can be timed one after another in one process
    (lesson 08 does, so they do not compete for cores): contiguous grows with the rank, zig-zag
    is level (`layout.causal_work` counts the pairs)."""
    gen = torch.Generator().manual_seed(rank)
    c, n = layout.chunk_len, layout.n_chunks
    q = torch.randn(batch, heads, c, head_dim, generator=gen)
    k, v = (torch.randn(batch, heads, c, head_dim, generator=gen) for _ in range(2))
    pairs = [(layout.positions(rank).chunk(len(layout.chunks(rank)))[i],
              torch.arange(j * c, (j + 1) * c))
             for i in range(len(layout.chunks(rank))) for j in range(n)]
    pairs = [(q_pos, k_pos) for q_pos, k_pos in pairs if visible(q_pos, k_pos, True) != "none"]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for q_pos, k_pos in pairs:
            attention_block(q, k, v, q_pos, k_pos, causal=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pair_seconds(chunk_lens, batch=1, heads=4, head_dim=32, repeats=15):
    """{c: {step: fastest seconds}} for one explicit forward chunk pair
    (`blockwise.attention_block`) of c queries against c keys, and its steps, for each c in
    `chunk_lens`, all timed side by side in interleaved rounds (a shared machine's load falls on
    all alike; lesson 08 reads them): "unmasked" (every key before every query), "diagonal" (the
    causal mask built and applied), and the diagonal's extra steps alone: "mask built" ((c, c)
    bool from the positions), "mask applied" (masked_fill of the (b, a, c, c) scores), and the
    softmax (logsumexp, exp) of "plain scores" and of "masked scores" (half of them -inf)."""
    steps = {c: _pair_steps(c, batch, heads, head_dim) for c in chunk_lens}
    best = {c: {name: float("inf") for name in steps[c]} for c in chunk_lens}
    for _ in range(repeats):
        for c in chunk_lens:
            for name, step in steps[c].items():
                start = time.perf_counter()
                step()
                best[c][name] = min(best[c][name], time.perf_counter() - start)
    return best


def _pair_steps(c, batch, heads, head_dim):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, c, head_dim, generator=gen) for _ in range(3))
    early, late = torch.arange(c), torch.arange(c, 2 * c)
    mask = visible(early, early, True)  # (c, c)
    plain = q @ k.transpose(-2, -1)  # (b, a, c, c)
    masked = plain.masked_fill(~mask, float("-inf"))
    softmax = lambda s: torch.exp(s - torch.logsumexp(s, -1, keepdim=True))  # noqa: E731
    return {"unmasked": lambda: attention_block(q, k, v, late, early, True),
            "diagonal": lambda: attention_block(q, k, v, early, early, True),
            "mask built": lambda: visible(early, early, True),
            "mask applied": lambda: plain.masked_fill(~mask, float("-inf")),
            "softmax, plain scores": lambda: softmax(plain),
            "softmax, masked scores": lambda: softmax(masked)}


def alone_and_together(group, variant="one process (sdpa)", batch=1, heads=4, seq_len=512,
                       head_dim=32, rounds=15):
    """(alone, together): fastest seconds of one forward + backward of a one-process `variant`
    on the group's first rank while the others wait at a barrier, and on every rank at once, in
    alternating rounds (round 0 a warm-up): what sharing the cores costs, measured side by side.
    The fastest, not the median: on a machine shared with other work it is the round least
    disturbed by it."""
    (q, k, v), layout = _inputs(variant, group, batch, heads, seq_len, head_dim)
    times = {"alone": [], "together": []}
    for r in range(rounds + 1):
        for mode in times:
            dist.barrier(group=group)
            start = time.perf_counter()
            if mode == "together" or dist.get_rank(group) == 0:
                attention_step(variant, q, k, v, group, layout)
            elapsed = time.perf_counter() - start
            dist.barrier(group=group)
            if r:
                times[mode].append(elapsed)
    return min(times["alone"]), min(times["together"])
