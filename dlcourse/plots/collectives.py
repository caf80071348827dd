"""Figures of lesson 02, each a pure function of values measured on real ranks.

    plot_collective(op, before, after)      ranks as rows, elements as cells, before | after
    plot_ring_step(trace, index, ax)        one step of a ring all-reduce (the widget's frame)
    plot_ring_steps(trace)                  every step of it, one small panel each
    plot_times(sizes, measured, modelled)   seconds against bytes, measured dots, model lines
    plot_busbw(sizes, measured, world_size, link_bandwidth)  nccl-tests' bus bandwidth, 1/beta line
    plot_scaling(measured, modelled)        time against the number of ranks, per algorithm

A cell is coloured by the ranks whose values it contains (`collectives.demo.contributors`): one
stripe per rank, so a sum over four ranks shows four stripes.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

from dlcourse.collectives.cost import busbw
from dlcourse.collectives.demo import contributors

RANK_COLOURS = plt.get_cmap("tab10").colors
DPI = 75
GUTTER = 1.6  # cell widths right of a ring frame for the arrows of what each rank sent


def rank_colour(rank):
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def plot_collective(op, before, after):
    """One op on every rank: before (left) and after (right); `before`/`after` are lists over
    ranks of a rank's values, or None where a rank holds nothing (before) or torch leaves its
    tensor undefined (after)."""
    width = max(len(v) for v in before + after if v is not None)
    fig, axes = plt.subplots(1, 2, figsize=(1.1 + 1.3 * width, 0.45 * len(before) + 0.9), dpi=DPI)
    for ax, rows, when in ((axes[0], before, "before"), (axes[1], after, "after")):
        _draw_ranks(ax, rows, width, empty="(nothing)" if when == "before" else "(undefined)")
        ax.set_title(f"{when}", fontsize=10)
    fig.suptitle(f"{op} on {len(before)} ranks", fontsize=11)
    fig.tight_layout()
    return fig


def plot_ring_step(trace, index, ax=None, arrows=True):
    """Frame `index` of a ring all-reduce: every rank's chunks, and which chunk went where.

    trace: per rank, the list `collectives.demo.ring_trace` returned on that rank.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(4.2, 0.5 * len(trace) + 0.8), dpi=DPI)
    rows = [per_rank[index][3] for per_rank in trace]
    _draw_ranks(ax, rows, len(rows[0]))
    label = trace[0][index][0]
    if arrows and index > 0:
        for rank, per_rank in enumerate(trace):
            _arrow(ax, rank, (rank + 1) % len(trace), per_rank[index][1], len(trace), len(rows[0]))
            _frame(ax, per_rank[index][2], len(trace) - 1 - rank)  # what just arrived
    ax.set_xlim(0, len(rows[0]) + GUTTER)  # the same width for every frame, arrows or not
    ax.set_title(label, fontsize=10)
    return ax


def plot_ring_steps(trace, columns=4):
    """Every frame of a ring all-reduce, start to finish, in a grid of small panels."""
    frames = len(trace[0])
    rows = -(-frames // columns)
    fig, axes = plt.subplots(rows, columns, dpi=DPI,
                             figsize=(2.9 * columns, (0.42 * len(trace) + 0.7) * rows))
    for index, ax in enumerate(axes.flat):
        if index < frames:
            plot_ring_step(trace, index, ax)
        else:
            ax.axis("off")
    fig.suptitle(f"ring all-reduce on {len(trace)} ranks: dashed, the chunk cN a rank sends to the "
                 "next (arrow); framed, the chunk that arrived", fontsize=11)
    fig.tight_layout()
    return fig


def plot_times(sizes, measured, modelled=None, title="time of one op"):
    """Seconds against bytes, log-log: measured {name: seconds per size} as dots joined by thin
    lines, modelled {name: seconds per size} as dashed lines of the same colour."""
    fig, ax = plt.subplots(figsize=(6.2, 3.8), dpi=DPI)
    for i, (name, seconds) in enumerate(measured.items()):
        ax.plot(sizes, seconds, "o-", lw=0.8, color=f"C{i}", label=f"{name}, measured")
        if modelled and name in modelled:
            ax.plot(sizes, modelled[name], "--", color=f"C{i}", label=f"{name}, alpha-beta model")
    _log_axes(ax, "message size (bytes)", "seconds")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_busbw(sizes, measured, world_size, op="all_reduce", link_bandwidth=None):
    """nccl-tests' bus bandwidth (GB/s) against size, for measured {name: seconds per size};
    `link_bandwidth` (bytes/s, 1 / beta of a fitted alpha-beta model), if given, as a line."""
    fig, ax = plt.subplots(figsize=(6.2, 3.4), dpi=DPI)
    for i, (name, seconds) in enumerate(measured.items()):
        gbps = [busbw(op, s, t, world_size) / 1e9 for s, t in zip(sizes, seconds)]
        ax.plot(sizes, gbps, "o-", color=f"C{i}", label=name)
    if link_bandwidth is not None:
        ax.axhline(link_bandwidth / 1e9, color="black", ls="--", lw=0.9,
                   label=f"1 / beta = {link_bandwidth / 1e9:.2f} GB/s (the link, fitted)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{op} bus bandwidth on {world_size} ranks")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_scaling(measured, modelled, nbytes):
    """Time against the number of ranks: measured {name: {n: seconds}} as dots, modelled
    {name: {n: seconds}} as lines."""
    fig, ax = plt.subplots(figsize=(6.2, 3.6), dpi=DPI)
    for i, name in enumerate(modelled):
        ns = sorted(modelled[name])
        ax.plot(ns, [modelled[name][n] for n in ns], "-", color=f"C{i}", label=f"{name}, model")
        if name in measured:
            ns = sorted(measured[name])
            ax.plot(ns, [measured[name][n] for n in ns], "o", color=f"C{i}",
                    label=f"{name}, measured")
    _log_axes(ax, "ranks", "seconds")
    ax.set_title(f"all-reduce of {nbytes / 2**20:g} MB as the number of ranks grows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _draw_ranks(ax, rows, width, empty=""):
    """Rank r as row r from the top; each value a cell striped by its contributing ranks."""
    for rank, values in enumerate(rows):
        y = len(rows) - 1 - rank
        if values is None:
            ax.text(width / 2, y + 0.5, empty, ha="center", va="center", color="0.5",
                    fontsize=9)
        for x, value in enumerate(values or []):
            _draw_cell(ax, x, y, value)
    ax.set_xlim(0, width)
    ax.set_ylim(0, len(rows))
    ax.set_yticks([len(rows) - 0.5 - r for r in range(len(rows))],
                  [f"rank {r}" for r in range(len(rows))])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


def _draw_cell(ax, x, y, value):
    ranks = contributors(value)
    stripe = 1 / max(1, len(ranks))
    for i, r in enumerate(ranks):
        ax.add_patch(Rectangle((x + i * stripe, y), stripe, 1, color=rank_colour(r), alpha=0.45))
    ax.add_patch(Rectangle((x, y), 1, 1, fill=False, edgecolor="white", lw=2))
    ax.text(x + 0.5, y + 0.5, f"{value:g}", ha="center", va="center", fontsize=8)


def _frame(ax, x, y):
    ax.add_patch(Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, fill=False, edgecolor="black", lw=1.5))


def _arrow(ax, rank, to, chunk, world_size, width):
    """What rank sent: its chunk cell outlined (dashed, in the rank's colour) and an arrow in the
    gutter right of the cells, from its row to the next rank's, labelled with the chunk number.
    The wrap-around from the last rank to rank 0 runs back up the outer side of the gutter."""
    if chunk is None:
        return
    y_from = world_size - 1 - rank + 0.5
    y_to = world_size - 1 - to + 0.5
    colour = rank_colour(rank)
    ax.add_patch(Rectangle((chunk + 0.1, y_from - 0.4), 0.8, 0.8, fill=False, edgecolor=colour,
                           lw=1.5, ls="--"))
    x = width + (GUTTER - 0.35 if to < rank else 0.2)
    ax.add_patch(FancyArrowPatch((x, y_from), (x, y_to), arrowstyle="-|>", mutation_scale=9,
                                 color=colour, lw=1.2, shrinkA=2, shrinkB=2))
    ax.text(x + 0.07, (y_from + y_to) / 2, f"c{chunk}", color=colour, fontsize=7, va="center")


def _log_axes(ax, xlabel, ylabel):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
