"""Figures of lesson 04 (tensor parallelism), each a pure function of its inputs.

    plot_split_matmul(tp)                         Y = X W split by W's columns, and by its rows
    plot_activation_bytes(tps, curves, measured)  activation bytes per rank against t
    plot_step_time(tps, measured, predicted)      step time against t, and its communication part
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dlcourse.plots.collectives import rank_colour

DPI = 75


def _matrix(ax, x, y, w, h, label, splits=1, axis="cols", colours=None):
    """A w x h box at (x, y), cut into `splits` coloured blocks along `axis`."""
    for i in range(splits):
        colour = colours[i] if colours else "lightgrey"
        if axis == "cols":
            box = Rectangle((x + i * w / splits, y), w / splits, h, fc=colour, ec="black", alpha=0.6)
        else:
            box = Rectangle((x, y + h - (i + 1) * h / splits), w, h / splits, fc=colour, ec="black",
                            alpha=0.6)
        ax.add_patch(box)
    ax.text(x + w / 2, y - 0.35, label, ha="center", va="top", fontsize=9)


def plot_split_matmul(tp=4):
    """Y = X W on tp ranks, two ways: W cut by columns (each rank owns whole columns of Y, an
    all-gather joins them), and W cut by rows with X cut by columns (each rank holds a partial
    sum of all of Y, an all-reduce adds them)."""
    colours = [rank_colour(r) for r in range(tp)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), dpi=DPI)
    ax = axes[0]
    _matrix(ax, 0, 0, 2, 2, "X (whole, every rank)")
    _matrix(ax, 3, 0, 3, 2, "W: rank r owns columns r", tp, "cols", colours)
    _matrix(ax, 7, 0, 3, 2, "Y = [X W_0 | X W_1 | ...]", tp, "cols", colours)
    ax.text(8.5, 2.3, "all-gather", ha="center", fontsize=10, weight="bold")
    ax.set_title("column-parallel: split W's output features", fontsize=10)
    ax = axes[1]
    _matrix(ax, 0, 0, 2, 2, "X: rank r owns columns r", tp, "cols", colours)
    _matrix(ax, 3, 0, 3, 2, "W: rank r owns rows r", tp, "rows", colours)
    for r in range(tp):
        _matrix(ax, 7 + 0.25 * r, 0.25 * (tp - 1 - r), 2.2, 1.4, "", 1, colours=[colours[r]])
    ax.text(8.6, -0.35, "Y = sum_r X_r W_r", ha="center", va="top", fontsize=9)
    ax.text(8.6, 2.3, "all-reduce", ha="center", fontsize=10, weight="bold")
    ax.set_title("row-parallel: split W's input features", fontsize=10)
    for ax in axes:
        ax.text(2.5, 1, "x", ha="center", va="center", fontsize=14)
        ax.text(6.5, 1, "=", ha="center", va="center", fontsize=14)
        ax.set_xlim(-0.5, 10.5)
        ax.set_ylim(-1.2, 2.7)
        ax.axis("off")
    fig.suptitle(f"one matrix multiply on {tp} ranks (colour = rank)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_activation_bytes(tps, curves, measured):
    """curves: {label: [bytes per rank at each t in tps]} drawn as lines; measured: {label:
    {t: bytes}} drawn as markers on the line of the same label."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    for i, (label, values) in enumerate(curves.items()):
        colour = f"C{i}"
        ax.plot(tps, [v / 1e6 for v in values], "-" if "paper" not in label else "--",
                color=colour, label=label)
        points = measured.get(label, {})
        if points:
            ax.plot(list(points), [v / 1e6 for v in points.values()], "o", color=colour,
                    label=f"{label}: measured")
    ax.set_xscale("log", base=2)
    return _against_tp(fig, ax, tps, "activation bytes per rank (MB)",
                       "activations saved for backward, per rank")


def plot_step_time(tps, measured, predicted_comm):
    """Measured seconds per step at each t, beside the alpha-beta prediction of its collectives."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    ax.plot(tps, [1000 * s for s in measured], "o-", label="measured step time")
    ax.plot(tps, [1000 * s for s in predicted_comm], "s--", label="collectives (alpha-beta model)")
    return _against_tp(fig, ax, tps, "milliseconds per training step",
                       "step time against tensor-parallel size on this machine")


def _against_tp(fig, ax, tps, ylabel, title):
    """The axes of a figure against the tensor-parallel size: one tick per t, labels, legend."""
    ax.set_xticks(tps, [str(t) for t in tps])
    ax.set_xlabel("tensor-parallel size t (ranks)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
