"""Figures of lesson 08 (context parallelism, `lessons/08_context_parallel.ipynb`), each a pure
function of its inputs.

    plot_score_blocks(owners)                  the s x s scores in chunk blocks: who computes which
    plot_causal_work(work, seconds)            each rank's causal scores, counted and timed
    plot_ring_steps(steps)                     whose K/V each rank holds at each ring step, and
                                               how much of that block it computes
    plot_ring_overlap(block_lens, machines)    one ring step's compute against its message, by
                                               block length: where the ring hides its messages
    plot_activation_bytes(seq_lens, curves)    activation bytes per rank against the sequence length
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from dlcourse.plots.collectives import rank_colour

DPI = 75


def plot_score_blocks(owners):
    """owners: {title: (n, n) nested list, owners[i][j] = the rank that computes query chunk i
    against key chunk j, or None where a causal mask hides the whole block}. One panel each:
    the attention scores of one sequence, coloured by the rank that computes them."""
    fig, axes = plt.subplots(1, len(owners), figsize=(4.2 * len(owners), 4.2), dpi=DPI,
                             squeeze=False)
    ranks = sorted({r for grid in owners.values() for row in grid for r in row if r is not None})
    for ax, (title, grid) in zip(axes[0], owners.items()):
        n = len(grid)
        for i, row in enumerate(grid):
            for j, rank in enumerate(row):
                colour = "white" if rank is None else rank_colour(rank)
                ax.add_patch(Rectangle((j, n - 1 - i), 1, 1, fc=colour, ec="black",
                                       alpha=0.7 if rank is not None else 1))
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_xticks([j + 0.5 for j in range(n)], [str(j) for j in range(n)])
        ax.set_yticks([n - 1 - i + 0.5 for i in range(n)], [str(i) for i in range(n)])
        ax.set_xlabel("key chunk (the tokens attended to)")
        ax.set_ylabel("query chunk")
        ax.set_title(title, fontsize=10)
    handles = [Patch(fc=rank_colour(r), alpha=0.7, label=f"rank {r}") for r in ranks]
    handles.append(Patch(fc="white", ec="black", label="masked: not computed"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_causal_work(work, seconds):
    """work: {layout: [query-key scores computed per rank]}; seconds: {layout: [measured compute
    seconds per rank]}. Left: the work counted; right: the compute timed, each rank its own bar."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), dpi=DPI)
    for ax, data, label in ((axes[0], work, "query-key scores computed (counted)"),
                            (axes[1], seconds, "compute seconds (measured)")):
        names = list(data)
        cp = len(data[names[0]])
        width = 0.8 / len(names)
        for k, name in enumerate(names):
            xs = [r + (k - (len(names) - 1) / 2) * width for r in range(cp)]
            ax.bar(xs, data[name], width, label=name, color=f"C{k}")
        ax.set_xticks(range(cp), [f"rank {r}" for r in range(cp)])
        ax.set_ylabel(label)
        ax.legend(fontsize=9)
    axes[0].set_title("causal attention: work per rank, counted", fontsize=10)
    axes[1].set_title("the same, timed (no messages)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_activation_bytes(seq_lens, curves, budget=None):
    """curves: {label: [bytes per rank at each sequence length]}; log-log. budget: an optional
    horizontal line (bytes) to show what fits."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    for k, (label, values) in enumerate(curves.items()):
        ax.plot(seq_lens, [v / 2**30 for v in values], "o-", color=f"C{k}", label=label)
    if budget is not None:
        ax.axhline(budget / 2**30, color="black", ls="--", lw=1, label="device memory")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("activation GiB per rank")
    ax.set_title("saved activations per rank against sequence length", fontsize=10)
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


def plot_ring_steps(steps):
    """steps: {title: (cp, cp) nested list, steps[r][j] = (src, share): at ring step j rank r holds
    rank src's K/V and computes `share` of that block's scores (1 whole, 0.5 half, 0 skipped).
    One panel each: ranks down, steps across; a cell coloured by whose K/V it is, shaded by the
    share computed, the share written in it. A ring step ends when its busiest rank ends."""
    fig, axes = plt.subplots(1, len(steps), figsize=(4.4 * len(steps), 3.4), dpi=DPI,
                             squeeze=False)
    for ax, (title, grid) in zip(axes[0], steps.items()):
        cp = len(grid)
        for r, row in enumerate(grid):
            for j, (src, share) in enumerate(row):
                ax.add_patch(Rectangle((j, cp - 1 - r), 1, 1, fc=rank_colour(src), ec="black",
                                       alpha=0.15 + 0.65 * share))
                ax.text(j + 0.5, cp - 0.5 - r, f"K/V {src}\n{share:g}", ha="center", va="center",
                        fontsize=8)
        ax.set_xlim(0, cp)
        ax.set_ylim(0, cp)
        ax.set_xticks([j + 0.5 for j in range(cp)], [str(j) for j in range(cp)])
        ax.set_yticks([cp - 0.5 - r for r in range(cp)], [f"rank {r}" for r in range(cp)])
        ax.set_xlabel("ring step (K/V move one rank right)")
        ax.set_ylabel("rank (its queries stay)")
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_ring_overlap(block_lens, machines):
    """machines: {name: (compute seconds per block length, message seconds per block length,
    the shortest block that hides its message)}; log-log. Per machine, a solid line for the
    compute (grows as c²), a dashed one for the message (alpha + c·bytes·beta), and a dotted
    vertical line where the first overtakes the second."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    for k, (name, (compute, message, shortest)) in enumerate(machines.items()):
        ax.plot(block_lens, compute, "-", color=f"C{k}", label=f"{name}: compute")
        ax.plot(block_lens, message, "--", color=f"C{k}", label=f"{name}: K/V message")
        ax.axvline(shortest, color=f"C{k}", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("block length c (tokens per rank)")
    ax.set_ylabel("seconds per ring step")
    ax.set_title("one forward ring step, no mask: the message hides right of the dotted line",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
