"""Lesson 07's figures (`lessons/07_combining.ipynb`): the rank grid, which ranks talk on which
axis, and what each grid measured per rank beside its formula. Pure functions of a `RankGrid`
and of measured numbers."""

import matplotlib.pyplot as plt
import numpy as np

AXIS_STYLE = {  # axis -> (colour, what runs on it)
    "tp": ("tab:red", "tp: all-reduce of activations, every layer"),
    "dp": ("tab:blue", "dp: gradients averaged once a step (ZeRO-3: parameters gathered "
                       "every layer, every micro-batch)"),
    "pp": ("tab:green", "pp: activations sent to the next stage"),
    "cp": ("tab:purple", "cp: keys and values passed on (or gathered), every attention layer"),
}


def rank_position(grid, rank):
    """(x, y) of `rank` in the picture: one panel per pipeline stage, cp then tp across (a
    block of tp ranks for each cp coordinate, lesson 08), dp down."""
    c = grid.coords(rank)
    return c["pp"] * (grid.tp * grid.cp + 1) + c.get("cp", 0) * grid.tp + c["tp"], -c["dp"]


def _arc(xs, ys, lift):
    """50 points on a parabola from the group's first rank to its last, `lift` high at the
    middle (negative: below): arcs keep pp and cp lines off the straight tp lines."""
    t = np.linspace(0, 1, 50)
    return xs[0] + (xs[-1] - xs[0]) * t, ys[0] + lift * 4 * t * (1 - t)


def plot_rank_grid(grid, ax=None, title=None, legend=True):
    """Every rank as a numbered dot, and one line per group of each axis joining its ranks
    (pp groups as arcs over the stages, higher for a higher tp coordinate, so none overlap; cp
    groups as arcs under their rows, deeper for a higher tp coordinate)."""
    width = grid.tp * grid.cp + 1  # columns a pipeline stage takes, with one of space
    ax = ax or plt.subplots(figsize=(2 + 1.3 * grid.pp * width, 1.5 + grid.dp))[1]
    for axis, (colour, label) in AXIS_STYLE.items():
        if getattr(grid, axis) == 1:
            continue
        for i, ranks in enumerate(grid.axis_groups(axis)):
            xs, ys = zip(*(rank_position(grid, r) for r in ranks))
            tp_coord = grid.coords(ranks[0])["tp"]
            if axis == "pp":  # an arc from the first stage to the last
                xs, ys = _arc(xs, ys, 0.25 + 0.2 * tp_coord)
            elif axis == "cp":  # under the row, so it does not hide the tp line
                xs, ys = _arc(xs, ys, -(0.15 + 0.1 * tp_coord))
            ax.plot(xs, ys, "-", color=colour, lw=3, alpha=0.6,
                    label=label if i == 0 else None, zorder=1)
    for rank in range(grid.world_size):
        x, y = rank_position(grid, rank)
        ax.scatter([x], [y], s=500, color="white", edgecolors="black", zorder=2)
        ax.text(x, y, str(rank), ha="center", va="center", fontsize=10, zorder=3)
    for stage in range(grid.pp):
        ax.text(stage * width + (width - 2) / 2, -grid.dp + 0.5, f"stage {stage}",
                ha="center", fontsize=9)
    ax.set_xlim(-0.7, grid.pp * width - 0.3)
    ax.set_ylim(-grid.dp + 0.3, 0.2 + 0.2 * grid.tp + (0.25 if grid.pp > 1 else 0))
    ax.set_xticks([]), ax.set_yticks([])
    ax.set_xlabel("tp coordinate (inside each pipeline stage)" if grid.cp == 1 else
                  "cp coordinate, then tp coordinate (inside each pipeline stage)")
    ax.set_ylabel("dp coordinate")
    cp = f" x cp {grid.cp}" if grid.cp > 1 else ""
    ax.set_title(title or f"dp {grid.dp}{cp} x tp {grid.tp} x pp {grid.pp}: "
                          f"{grid.world_size} ranks, order {' > '.join(grid.order)}")
    if legend and grid.world_size > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def plot_grid_measurements(names, measured, formula, comm, comm_formula, step_ms, *,
                           activations=None, activation_formula=None):
    """One bar group per grid, in panels: model-state bytes of the busiest rank, its activation
    bytes (if given), the bytes rank 0 moved in one step (each measured beside its formula), and
    the median step time. Returns the figure."""
    pairs = [(measured, formula, "kB per rank (busiest rank)", "model state: params + grads + AdamW")]
    if activations is not None:
        pairs.append((activations, activation_formula, "kB held at once (busiest rank)",
                      "activations (SavedTensorLog)"))
    pairs.append((comm, comm_formula, "kB moved by rank 0 in one step",
                  "communication (bus bytes, CommCounter)"))
    fig, axes = plt.subplots(1, len(pairs) + 1, figsize=(4.3 * (len(pairs) + 1), 3.8))
    xs = range(len(names))
    for ax, (got, want, ylabel, title) in zip(axes, pairs):
        ax.bar([x - 0.2 for x in xs], [b / 1e3 for b in got], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [b / 1e3 for b in want], 0.4, label="formula")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper right")
        ax.set_ylim(0, 1.3 * ax.get_ylim()[1])  # room for the legend above the bars
    axes[-1].bar(xs, step_ms, 0.6, color="tab:gray")
    axes[-1].set_ylabel("ms per step (median)")
    axes[-1].set_title("step time (ranks share this machine's cores)")
    for ax in axes:
        ax.set_xticks(list(xs), names, rotation=20, fontsize=8)
        ax.set_xlabel("grid")
    fig.tight_layout()
    return fig
