"""Figures of lesson 09 (mixture of experts, `lessons/09_experts.ipynb`), each a pure function of
its inputs.

    plot_routing(experts, n_experts, ep)          which tokens go to which expert (and rank)
    plot_expert_load(histories, layer=0)          heat maps: assignments per expert per step
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


def plot_expert_load(histories, layer=0):
    """histories: {title: tensor (steps, MoE layers, E) of assignments each expert computed}
    (`routing_history`'s "tokens"). One heat map per title for one MoE layer, shared colours."""
    fig, axes = plt.subplots(1, len(histories), figsize=(4.6 * len(histories), 3.4), dpi=DPI,
                             squeeze=False)
    grids = {t: h[:, layer, :].T.float() for t, h in histories.items()}  # (E, steps)
    top = max(g.max().item() for g in grids.values())
    for ax, (title, grid) in zip(axes[0], grids.items()):
        image = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=top,
                          origin="lower")
        ax.set_xlabel("training step")
        ax.set_ylabel("expert")
        ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=list(axes[0]), label="assignments computed")
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
