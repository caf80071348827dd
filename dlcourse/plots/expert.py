"""Figures of lesson 09 (mixture of experts, `lessons/09_experts.ipynb`), each a pure function of
its inputs.

    plot_routing(experts, n_experts, ep)          which tokens go to which expert (and rank)
    plot_send_matrix(sent)                        heat map: rows rank s sent rank d (ep x ep)
    plot_expert_load(histories, layer=0)          heat maps: each expert's load / the mean, per
                                                  step; the busiest expert's, step by step
    plot_capacity_drops(factors, dropped, total)  assignments dropped against the capacity factor
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from dlcourse.plots.collectives import rank_colour

DPI = 75


def plot_routing(experts, n_experts, ep):
    """experts: (N, k) nested list, token n's chosen experts, first choice first. One row per
    token, one column per expert; a cell is filled where the token goes to that expert, coloured
    by the rank that holds the expert (experts dealt out in blocks of E/ep), darker for choice 0."""
    n_tokens, per_rank = len(experts), n_experts // ep
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * n_experts, 0.9 + 0.3 * n_tokens), dpi=DPI)
    for n, chosen in enumerate(experts):
        for j, e in enumerate(chosen):
            ax.add_patch(plt.Rectangle((e, n_tokens - 1 - n), 1, 1, fc=rank_colour(e // per_rank),
                                       ec="black", alpha=1.0 if j == 0 else 0.45))
    ax.set_xlim(0, n_experts)
    ax.set_ylim(0, n_tokens)
    ax.set_xticks([e + 0.5 for e in range(n_experts)], [str(e) for e in range(n_experts)])
    ax.set_yticks([n_tokens - 1 - n + 0.5 for n in range(n_tokens)],
                  [str(n) for n in range(n_tokens)])
    ax.set_xlabel("expert")
    ax.set_ylabel("token")
    ax.set_title(f"top-{len(experts[0])} routing: {n_tokens} tokens, {n_experts} experts "
                 f"on {ep} ranks", fontsize=10)
    handles = [Patch(fc=rank_colour(r), label=f"rank {r}") for r in range(ep)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8,
              title="expert held by\n(pale: 2nd choice)", title_fontsize=8)
    fig.tight_layout()
    return fig


def plot_send_matrix(sent, title="rows sent in the dispatch"):
    """sent: (ep, ep) nested list, sent[s][d] = rows rank s sends rank d. A heat map with the
    count in every cell; the diagonal (rows that stay on their rank) outlined."""
    ep, top = len(sent), max(max(map(max, sent)), 1)
    fig, ax = plt.subplots(figsize=(1.6 + 0.75 * ep, 1.2 + 0.65 * ep), dpi=DPI)
    image = ax.imshow(sent, cmap="Blues", vmin=0, vmax=top)
    for s_ in range(ep):
        for d in range(ep):
            ax.text(d, s_, str(sent[s_][d]), ha="center", va="center", fontsize=10,
                    color="white" if sent[s_][d] > top / 2 else "black")
        ax.add_patch(plt.Rectangle((s_ - 0.5, s_ - 0.5), 1, 1, fill=False, ec="black", lw=1.5))
    ax.set_xticks(range(ep))
    ax.set_yticks(range(ep))
    ax.set_xlabel("to rank")
    ax.set_ylabel("from rank")
    ax.set_title(f"{title}\n(outlined: rows that stay)", fontsize=10)
    fig.colorbar(image, ax=ax, label="rows")
    fig.tight_layout()
    return fig


def plot_expert_load(histories, layer=0):
    """histories: {title: tensor (steps, MoE layers, E) of assignments each expert computed}
    (`routing_history`'s "tokens"). Top: one heat map per title for one MoE layer, each
    expert's load over its step's mean (1: even; red over, blue under, shared colours).
    Bottom: the busiest expert's load over the mean, step by step, one line per title."""
    n = len(histories)
    fig = plt.figure(figsize=(4.2 * n, 5.6), dpi=DPI)
    grid = fig.add_gridspec(2, n, height_ratios=(3, 2), hspace=0.4)
    bottom = fig.add_subplot(grid[1, :])
    for i, (title, history) in enumerate(histories.items()):
        tokens = history[:, layer, :].float()  # (steps, E)
        relative = tokens / tokens.mean(dim=1, keepdim=True)  # 1 = even
        ax = fig.add_subplot(grid[0, i])
        image = ax.imshow(relative.T.numpy(), aspect="auto", cmap="RdBu_r", vmin=0, vmax=2,
                          origin="lower", interpolation="nearest")
        ax.set_xlabel("training step")
        ax.set_ylabel("expert")
        ax.set_title(title, fontsize=10)
        bottom.plot(relative.max(dim=1).values.numpy(), label=title)
    fig.colorbar(image, ax=fig.axes[1:], label="load / mean (1 = even)")
    bottom.axhline(1.0, color="grey", lw=0.8, ls="--")
    bottom.set_xlabel("training step")
    bottom.set_ylabel("busiest expert / mean")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    return fig


def plot_capacity_drops(factors, dropped, total):
    """factors: capacity factors; dropped: assignments dropped at each; total: the assignments
    routed (k·N). The share dropped against the factor."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=DPI)
    ax.plot(factors, [100 * d / total for d in dropped], marker="o")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("assignments dropped (%)")
    ax.set_title(f"tokens over capacity, of {total} assignments", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
