"""The planner's figure (lesson 07): what training a model costs against how long it takes, one
point per layout that fits, for several cluster sizes; the Pareto front joins the layouts that no
other beats on both. A pure function of `Plan`s (`dlcourse.planner.rank.plan`)."""

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from dlcourse.planner.rank import pareto


def train_hours_and_dollars(estimate, plan, tokens):
    """(hours, dollars) to train on `tokens` tokens with this layout of `plan`'s cluster."""
    hours = tokens / estimate.tokens_per_s / 3600
    return hours, hours * plan.cluster.dollars_per_hour()


def plot_cost_vs_time(plans, tokens, recommended=None, ax=None, top=200):
    """Scatter of (days, dollars) for the `top` cheapest fitting layouts of each plan (one colour
    per GPU count), the Pareto front over all of them, and `recommended` (an (plan, estimate)
    pair) ringed. Returns the axes."""
    ax = ax or plt.subplots(figsize=(8, 4.2))[1]
    points = []
    for plan in plans:
        xy = [train_hours_and_dollars(e, plan, tokens) for e in plan.ranked[:top]]
        if not xy:
            continue
        days = [h / 24 for h, _ in xy]
        ax.scatter(days, [d for _, d in xy], s=12, alpha=0.5,
                   label=f"{plan.cluster.n_gpus} x {plan.cluster.gpu.name}")
        points += [(h / 24, d, e.layout.describe()) for (h, d), e in zip(xy, plan.ranked)]
    front = pareto(points)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k-", lw=1, label="Pareto front")
    if recommended:
        h, d = train_hours_and_dollars(recommended[1], recommended[0], tokens)
        ax.scatter([h / 24], [d], s=120, facecolors="none", edgecolors="red", lw=2,
                   label="recommended")
    ax.set_xscale("log")  # each doubling of the GPUs halves the time at best: equal steps
    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _dollars(y)))
    ax.set_xlabel(f"days to train on {tokens / 1e9:,.0f} B tokens (log scale)")
    ax.set_ylabel("cost of the training run")
    ax.set_title("Every layout that fits: cost against time")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def _dollars(y):
    """$1.25M, $830k, $12: three significant digits in the unit that fits."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(y) >= size:
            return f"${y / size:.3g}{unit}"
    return f"${y:.3g}"
