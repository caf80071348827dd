"""Lesson 08's figures (`dlcourse/plots/context.py`) draw what they are given: one coloured block
per computed (query chunk, key chunk) pair, one bar per rank at its value, one line per curve."""

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dlcourse.parallel.context import Layout, causal_work
from dlcourse.plots.context import (plot_activation_bytes, plot_causal_work, plot_ring_overlap,
                                   plot_ring_steps, plot_score_blocks)


def causal_owners(layout):
    holder = {c: r for r in range(layout.cp) for c in layout.chunks(r)}
    n = layout.n_chunks
    return [[holder[i] if i >= j else None for j in range(n)] for i in range(n)]


def test_score_blocks_colour_each_ranks_computed_pairs_and_leave_the_masked_white():
    layouts = {name: Layout(name, 4, 16) for name in ("contiguous", "zigzag")}
    fig = plot_score_blocks({name: causal_owners(layout) for name, layout in layouts.items()})
    for ax, (name, layout) in zip(fig.axes, layouts.items()):
        boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(boxes) == layout.n_chunks ** 2
        coloured = {}
        for box in boxes:
            if box.get_facecolor()[:3] != (1.0, 1.0, 1.0):
                coloured[box.get_facecolor()] = coloured.get(box.get_facecolor(), 0) + 1
        assert sorted(coloured.values()) == sorted(causal_work(layout))  # pairs per rank
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_causal_work_bars_are_the_values_per_rank_and_activation_curves_the_points():
    work = {"contiguous": [1, 2, 3, 4], "zigzag": [9, 9, 9, 9]}
    fig = plot_causal_work(work, {"contiguous": [0.1, 0.2, 0.3, 0.4], "zigzag": [0.2] * 4})
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == work["contiguous"] + work["zigzag"]
    plt.close(fig)
    fig = plot_activation_bytes([1024, 2048], {"one": [2**30, 2**31], "two": [2**29, 2**30]})
    lines = fig.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in lines] == [[1, 2], [0.5, 1]]  # GiB
    assert fig.axes[0].get_title() and fig.axes[0].get_ylabel() == "activation GiB per rank"
    plt.close(fig)


def test_ring_steps_colour_each_cell_by_whose_kv_and_shade_it_by_the_share_computed():
    cp = 3
    grid = [[((r - j) % cp, 1.0 if j == 0 else 0.5 * (r % 2)) for j in range(cp)] for r in range(cp)]
    fig = plot_ring_steps({"one": grid})
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(boxes) == cp * cp
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == sorted(f"K/V {src}\n{share:g}" for row in grid for src, share in row)
    alphas = sorted(round(b.get_alpha(), 6) for b in boxes)
    assert alphas == sorted(round(0.15 + 0.65 * share, 6) for row in grid for _, share in row)
    assert ax.get_title() == "one" and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_ring_overlap_draws_compute_and_message_per_machine_and_marks_the_crossing():
    lens = [64, 128, 256]
    machines = {"cpu": ([1, 4, 16], [2, 3, 5], 150), "gpu": ([0.1, 0.4, 1.6], [1, 1, 1], 256)}
    fig = plot_ring_overlap(lens, machines)
    ax = fig.axes[0]
    lines = ax.get_lines()  # per machine: compute, message, the vertical line
    assert [list(line.get_ydata()) for line in lines[0::3]] == [[1, 4, 16], [0.1, 0.4, 1.6]]
    assert [list(line.get_ydata()) for line in lines[1::3]] == [[2, 3, 5], [1, 1, 1]]
    assert [line.get_xdata()[0] for line in lines[2::3]] == [150, 256]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)
