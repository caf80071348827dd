"""Pictures of pipeline schedules (lesson 06): who runs which micro-batch when, and the bubble
against its formula. Pure functions of spans (`dlcourse.parallel.timeline.Span`) from a unit-time
simulation (`pipeline.measure.simulate`) or a measured run (`pipeline.measure.timed_step`).
"""

import matplotlib.pyplot as plt

KIND_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}


def plot_schedule(spans, title, ax=None, seconds=False):
    """One row per rank, one bar per action: forward blue, backward orange, weight-gradient
    green, later virtual stages (interleaved) hatched; the micro-batch on the bar. Time in units
    (a simulation) or, with seconds=True, measured seconds drawn in ms. Returns the Axes."""
    if not spans:
        raise ValueError("plot_schedule needs spans: simulate a schedule or time a step first")
    ax = ax or plt.subplots(figsize=(10, 2.4))[1]
    scale, t0 = (1000 if seconds else 1), min(s.start for s in spans)
    ranks = sorted({s.rank for s in spans})
    first_stage = {r: min(int(s.lane.split()[-1]) for s in spans if s.rank == r) for r in ranks}
    for s in spans:
        later_chunk = int(s.lane.split()[-1]) != first_stage[s.rank]
        ax.barh(s.rank, scale * s.duration, left=scale * (s.start - t0), height=0.8,
                color=KIND_COLOURS[s.name[0]], edgecolor="black", linewidth=0.4,
                hatch="//" if later_chunk else None)
        ax.text(scale * ((s.start + s.end) / 2 - t0), s.rank, s.name[1:], ha="center",
                va="center", fontsize=6, color="white")
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms, measured)" if seconds else "time (units: F = 1, full B = 2)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in KIND_COLOURS.values()]
    ax.legend(handles, ["forward F", "backward B", "weight grad W"], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax


def plot_bubble_vs_m(n_micros, measured, formula, title, ax=None):
    """Bubble fraction over m: measured points (label -> [fraction per m]) beside the formula
    curves (label -> [fraction per m]). Returns the Axes."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for (label, values), colour in zip(formula.items(), plt.rcParams["axes.prop_cycle"]):
        ax.plot(n_micros, values, "-", color=colour["color"], label=f"{label}: formula")
        if label in measured:
            ax.plot(n_micros, measured[label], "o", color=colour["color"],
                    label=f"{label}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n_micros, [str(m) for m in n_micros])
    ax.set_xlabel("micro-batches per step m")
    ax.set_ylabel("bubble: idle share of the step")
    ax.set_title(title)
    ax.legend(fontsize=8, frameon=False)
    return ax
