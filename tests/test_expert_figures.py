"""Lesson 09's figures (`dlcourse/plots/expert.py`) draw what they are given: one cell per
(token, chosen expert) in the colour of the expert's rank, one heat-map cell per (expert, step)
at its load over the step's mean and one point per step at the busiest's, one cell per (source,
destination) rank pair with its count printed, one point per capacity factor at its share
dropped."""

import matplotlib.colors as mc
import matplotlib.pyplot as plt
import torch

from dlcourse.plots.collectives import rank_colour
from dlcourse.plots.expert import (plot_capacity_drops, plot_expert_load, plot_routing,
                                   plot_send_matrix)


def test_routing_fills_each_chosen_expert_in_its_ranks_colour():
    experts = [[0, 3], [2, 1], [3, 2]]  # 3 tokens, top-2 of 4 experts on 2 ranks
    fig = plot_routing(experts, 4, 2)
    ax = fig.axes[0]
    cells = [(int(p.get_x()), 2 - int(p.get_y()), p.get_facecolor()[:3]) for p in ax.patches]
    want = [(e, n, rank_colour(e // 2)) for n, row in enumerate(experts) for e in row]
    assert [(x, y) for x, y, _ in cells] == [(e, n) for e, n, _ in want]
    assert [c for *_, c in cells] == [mc.to_rgb(c) for *_, c in want]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_expert_load_shows_every_count_and_drops_are_percentages():
    tokens = torch.tensor([[[5, 1, 0]], [[2, 2, 2]]])  # (steps 2, layers 1, E 3)
    fig = plot_expert_load({"a": tokens, "b": 2 * tokens})
    maps = [ax for ax in fig.axes if ax.images and ax.get_title()]
    relative = [[2.5, 1.0], [0.5, 1.0], [0.0, 1.0]]  # (E, steps): count / the step's mean
    for ax in maps:  # 2x the counts: the same loads
        assert torch.allclose(torch.tensor(ax.images[0].get_array().tolist()),
                              torch.tensor(relative))
        assert ax.images[0].get_clim() == (0, 2)
    busiest = [line.get_ydata().tolist() for ax in fig.axes for line in ax.get_lines()
               if line.get_label() in ("a", "b")]
    assert busiest == [[2.5, 1.0], [2.5, 1.0]]
    plt.close(fig)
    fig = plot_capacity_drops([0.5, 1.0, 2.0], [30, 6, 0], 60)
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == [50, 10, 0]
    plt.close(fig)


def test_send_matrix_prints_every_count_in_its_cell():
    sent = [[1, 3, 0], [2, 2, 5], [0, 4, 1]]  # sent[s][d]: rows rank s sends rank d
    fig = plot_send_matrix(sent)
    ax = fig.axes[0]
    assert ax.images[0].get_array().tolist() == sent
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
             for t in ax.texts}
    assert texts == {(s, d): str(sent[s][d]) for s in range(3) for d in range(3)}
    assert "from" in ax.get_ylabel() and "to" in ax.get_xlabel()
    plt.close(fig)
