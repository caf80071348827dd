"""Timelines from real runs drawn: what each rank was doing, and when (lesson 03; later lessons
too, e.g. a pipeline schedule's forward and backward micro-batches per stage).

The ranks record spans with `dlcourse.parallel.timeline.Timeline` and return them; this module
only draws what it is handed:

    spans = sum(dlcourse.launch(job), [])       # every rank's `Span`s
    plot_timeline(spans, "title")
"""

import re


def plot_timeline(spans, title, ax=None, lanes=None, colors=None, label_bars=False):
    """Draw `spans` (from any number of ranks) as horizontal bars: one band per rank, one row
    per lane in it, time in ms from the earliest start. Returns the Axes.

    lanes: lane names, top to bottom within a rank (default: order of first appearance).
    colors: name -> colour; other names get matplotlib's colour cycle in natural name order.
    label_bars: write each span's name on its bar (for short names such as "F3").
    """
    if not spans:
        raise ValueError("plot_timeline needs at least one Span; record some with "
                         "dlcourse.parallel.timeline.Timeline")
    import matplotlib.pyplot as plt  # here, not at the top: ranks record Timelines, never plot

    ax = ax or plt.subplots(figsize=(9, 3.5))[1]
    lanes = lanes or list(dict.fromkeys(s.lane for s in spans))
    ranks = sorted({s.rank for s in spans})
    colors = _colours_by_name(spans, colors or {})
    t0 = min(s.start for s in spans)
    row = {(r, lane): i * (len(lanes) + 1) + j for i, r in enumerate(ranks)
           for j, lane in enumerate(lanes)}  # a blank row between ranks
    for s, level, levels in _stack_overlaps(spans):
        height = 0.8 / levels  # spans running at the same time in one lane share its row
        y = row[(s.rank, s.lane)] - 0.4 + height * (level + 0.5)
        ax.barh(y, 1000 * s.duration, left=1000 * (s.start - t0), height=height,
                color=colors[s.name], edgecolor="black", linewidth=0.3, label=s.name)
        if label_bars:
            ax.text(1000 * (s.start + s.end - 2 * t0) / 2, y, s.name, ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(list(row.values()), [f"rank {r} {lane}" for r, lane in row])
    ax.invert_yaxis()  # rank 0 on top
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    _legend_once_per_name(ax)
    return ax


def _stack_overlaps(spans):
    """[(span, level, levels)]: spans of one rank and lane that overlap in time (two all-reduces
    in flight at once) go on separate levels, each on the first level free at its start."""
    out = []
    for key in dict.fromkeys((s.rank, s.lane) for s in spans):
        in_lane = sorted((s for s in spans if (s.rank, s.lane) == key), key=lambda s: s.start)
        ends, levels = [], []  # ends[i]: when the last span on level i ends
        for s in in_lane:
            level = next((i for i, end in enumerate(ends) if end <= s.start), len(ends))
            ends[level:level + 1] = [s.end]
            levels.append(level)
        out += [(s, level, len(ends)) for s, level in zip(in_lane, levels)]
    return out


def _colours_by_name(spans, given):
    # Names in natural order ("bucket 2" before "bucket 10"), so two runs with the same names
    # get the same colours whatever order their spans were recorded in.
    import matplotlib  # see plot_timeline

    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = dict(given)
    for name in sorted({s.name for s in spans}, key=_natural):
        if name not in colors:
            colors[name] = cycle[len(colors) % len(cycle)]
    return colors


def _natural(name):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name)]


def _legend_once_per_name(ax):
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(sorted(zip(labels, handles), key=lambda item: _natural(item[0])))
    if len(unique) <= 12:  # more names than that (a pipeline's micro-batches): label the bars
        ax.legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1),
                  fontsize=8, frameon=False)
