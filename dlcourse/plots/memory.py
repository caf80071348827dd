"""Figures of lesson 01 (memory): stacked bars of what holds the bytes, a step's timeline, and
which cards a model fits. Pure functions of `MemoryParts` and `StepMemory` values."""

import matplotlib.pyplot as plt


PARTS = {  # part -> (label, colour); the order is the stacking order, bottom first
    "params": ("parameters", "#4c72b0"),
    "grads": ("gradients", "#dd8452"),
    "optimizer": ("optimizer state", "#55a868"),
    "activations": ("activations", "#c44e52"),
    "weight_copies": ("weight copies (autocast)", "#8172b3"),
}
UNITS = [(1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")]  # decimal, as in the ZeRO paper


def byte_unit(largest):
    """(divisor, name) of the unit that shows `largest` bytes as a number of at least 1."""
    return next(((d, name) for d, name in UNITS if largest >= d), UNITS[-1])


def _axes(ax, figsize):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _stack(ax, x, parts_list, scale, width, **bar_kw):
    """Stacked bars at positions x, one per MemoryParts; returns the parts drawn."""
    bottoms, drawn = [0.0] * len(x), set()
    for part, (label, colour) in PARTS.items():
        heights = [getattr(p, part) / scale for p in parts_list]
        if any(heights):
            ax.bar(x, heights, width, bottom=bottoms, color=colour, label=label, **bar_kw)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
            drawn.add(part)
    return drawn


def plot_parts(columns, *, title, ax=None):
    """One stacked bar per column: {label: MemoryParts}."""
    ax = _axes(ax, (6, 3.2))
    scale, unit = byte_unit(max(p.total for p in columns.values()))
    _stack(ax, range(len(columns)), list(columns.values()), scale, 0.6)
    ax.set_xticks(range(len(columns)), list(columns))
    ax.set(title=title, ylabel=f"bytes ({unit})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return ax


def plot_measured_vs_estimated(measured, estimated, *, title, ax=None):
    """Per phase, the measured bar (solid) beside the estimated one (hatched), with the ratio
    measured / estimated of the totals above each pair. Both: {phase: MemoryParts}."""
    ax = _axes(ax, (7, 3.4))
    phases = list(measured)
    scale, unit = byte_unit(max(p.total for p in [*measured.values(), *estimated.values()]))
    x = range(len(phases))
    _stack(ax, [i - 0.2 for i in x], [measured[p] for p in phases], scale, 0.38)
    _stack(ax, [i + 0.2 for i in x], [estimated[p] for p in phases], scale, 0.38,
           hatch="//", alpha=0.55, edgecolor="white")
    for i, phase in enumerate(phases):
        ratio = measured[phase].total / estimated[phase].total
        top = max(measured[phase].total, estimated[phase].total) / scale
        ax.annotate(f"{ratio:.3f}", (i, top), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"after {p}\nmeasured | estimated" for p in phases], fontsize=8)
    ax.set(title=title, ylabel=f"bytes ({unit})")
    ax.margins(y=0.15)
    entries = {}  # one legend entry per part, the solid (measured) one
    for handle, label in zip(*ax.get_legend_handles_labels()):
        entries.setdefault(label, handle)
    ax.legend(entries.values(), entries.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return ax


def plot_timeline(step, *, title, ax=None):
    """The bytes a measured step holds, event by event (`StepMemory.timeline`), stacked by
    part, with the phases marked and the peak labelled."""
    ax = _axes(ax, (7, 3.2))
    points = step.timeline
    top = max(p.parts.total for p in points)
    scale, unit = byte_unit(top)
    tail = max(3, len(points) // 12)  # the optimizer step is one event: give it some width
    xs = list(range(len(points) + tail))
    drawn = [part for part in PARTS if any(getattr(p.parts, part) for p in points)]
    ys = [[getattr(p.parts, part) / scale for p in points + [points[-1]] * tail] for part in drawn]
    ax.stackplot(xs, *ys, labels=[PARTS[part][0] for part in drawn],
                 colors=[PARTS[part][1] for part in drawn], step="post")
    ends = [i for i, p in enumerate(points) if p.event.startswith("end of")]
    for start, end, i in zip([0] + ends[:-1], ends[:-1] + [xs[-1]], ends):
        if end > start:  # "init" has no events of its own
            ax.axvline(end, color="grey", lw=0.6)
            ax.text((start + end) / 2, 1.08 * top / scale, points[i].phase, ha="center", fontsize=8)
    peak = points.index(step.peak)
    ax.annotate(f"peak {top / scale:.2f} {unit}", (peak, top / scale), xytext=(12, 8),
                textcoords="offset points", fontsize=8, arrowprops=dict(arrowstyle="-", lw=0.6))
    ax.set(title=title, xlabel="event (tensor saved or freed, gradient accumulated, phase end)",
           ylabel=f"bytes ({unit})", xlim=(0, xs[-1]), ylim=(0, 1.2 * top / scale))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return ax


def plot_fit(models, *, cards, title, ax=None):
    """Horizontal stacked bars of bytes per GPU, {model name: MemoryParts}, with a dashed line
    at each card's memory (`cards`: sizes in GB); each bar is labelled with its total, and each
    part wide enough to hold a number with its own GB."""
    ax = _axes(ax, (7, 0.4 * len(models) + 1.5))
    names = list(models)[::-1]  # first model at the top
    left = [0.0] * len(names)
    largest = max(max(cards), *(models[n].total / 1e9 for n in names))
    for part, (label, colour) in PARTS.items():
        widths = [getattr(models[n], part) / 1e9 for n in names]
        if any(widths):
            bars = ax.barh(names, widths, left=left, color=colour, label=label)
            # a part's GB inside its segment where it has room (a tenth of the axis)
            ax.bar_label(bars, [f"{w:.1f}" if w > largest / 10 else "" for w in widths],
                         label_type="center", fontsize=7, color="white")
            left = [a + w for a, w in zip(left, widths)]
    for y, n in enumerate(names):  # every bar's total at its end, so small bars can be read
        ax.text(left[y], y, f" {models[n].total / 1e9:.2f} GB", va="center", fontsize=7)
    ax.set_xlim(0, 1.12 * largest)
    for gb in cards:
        ax.axvline(gb, color="black", ls="--", lw=0.8)
        ax.text(gb, 1.01, f"{gb} GB", transform=ax.get_xaxis_transform(), rotation=90,
                ha="center", va="bottom", fontsize=7)
    ax.set_xlabel("bytes per GPU (GB)")
    ax.set_title(title, pad=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    return ax


def parts_table(columns):
    """A small text table of {label: MemoryParts}, bytes by part, for printing beside a plot."""
    scale, unit = byte_unit(max(p.total for p in columns.values()))
    keys = [k for k in PARTS if any(getattr(p, k) for p in columns.values())] + ["total"]
    rows = [[label] + [f"{(p.total if k == 'total' else getattr(p, k)) / scale:,.2f}" for k in keys]
            for label, p in columns.items()]
    header = [f"({unit})"] + [PARTS[k][0] if k in PARTS else k for k in keys]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    return "\n".join(lines)
