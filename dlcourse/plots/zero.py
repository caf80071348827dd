"""Lesson 05's figures: model-state bytes per rank, stacked by part, measured beside ZeRO's
formula (the paper's Figure 1, measured), and a stage-3 step's timeline colours."""

import matplotlib.pyplot as plt

PARTS = [("params", "parameters", "tab:blue"), ("grads", "gradients", "tab:green"),
         ("optimizer", "optimizer state", "tab:orange")]


def plot_model_state(measured, formula, title, ax=None):
    """Stacked bars of parameters, gradients and optimizer state per rank, two per strategy:
    measured (solid) and ZeRO's formula (hatched). measured, formula: {label: MemoryParts},
    in the same order. Returns the Axes."""
    ax = ax or plt.subplots(figsize=(8, 3.8))[1]
    for i, label in enumerate(measured):
        for offset, parts, hatch in [(-0.2, measured[label], None), (0.2, formula[label], "//")]:
            bottom = 0
            for key, name, colour in PARTS:
                value = getattr(parts, key) / 1e6
                ax.bar(i + offset, value, width=0.38, bottom=bottom, color=colour, hatch=hatch,
                       edgecolor="black", linewidth=0.4,
                       label=name if i == 0 and hatch is None else None)
                bottom += value
    ax.bar(0, 0, color="white", edgecolor="black", hatch="//", label="formula (hatched)")
    ax.set_xticks(range(len(measured)), list(measured))
    ax.set_ylabel("model-state MB per rank")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def step_colours(spans):
    """name -> colour for a stage-3 timeline: forward blue, backward orange, all-gathers green,
    reduce-scatters red (names F0, B0, AG0, RS0, ... as ZeroStage3 records them)."""
    kinds = {"F": "tab:blue", "B": "tab:orange", "AG": "tab:green", "RS": "tab:red"}
    return {s.name: kinds[s.name.rstrip("0123456789")] for s in spans}
