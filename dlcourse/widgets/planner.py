"""The planner as a widget (lesson 07): pick a model, a GPU, how many, the batch and the price;
see the ranked layouts and what training costs against how long it takes.

    show_plan("llama-2-7b", gpu="h100", gpus=64)   # one setting: the table and the figure
    PlannerWidget()                                # controls; redraws on every change

The numbers come from `dlcourse.planner` (layouts, estimates, ranking); the figure from
`dlcourse.plots.planner.plot_cost_vs_time`. The training budget is 20 tokens per parameter,
Hoffmann et al. 2022's compute-optimal ratio. Saved in a notebook without a kernel, the widget
shows the figure of its starting setting instead of its controls.
"""

import base64
import io
from dataclasses import replace

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output, display

from dlcourse.memory.calculator import spec_params
from dlcourse.planner.catalog import MODELS, model
from dlcourse.planner.hardware import GPUS, Cluster, gpu as find_gpu
from dlcourse.planner.layouts import Workload
from dlcourse.planner.rank import format_plan, plan
from dlcourse.plots.planner import plot_cost_vs_time

TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022 (Chinchilla): compute-optimal training tokens
DEFAULTS = dict(model="Llama-2 7B", gpu="h100", gpus=64, tokens_per_step=4 * 2**20, price=None)


def plans_around(work, cluster, factors=(0.25, 0.5, 1, 2, 4)):
    """Plans for the cluster and for fewer and more GPUs of the same kind (those that can
    split the batch)."""
    found = []
    for factor in factors:
        n = int(cluster.n_gpus * factor)
        if n >= 1 and n == cluster.n_gpus * factor:
            try:
                found.append(plan(work, replace(cluster, n_gpus=n), advise=(factor == 1)))
            except ValueError:
                continue  # this many GPUs cannot split the batch
    return found


def plan_view(model_name=DEFAULTS["model"], gpu=DEFAULTS["gpu"], gpus=DEFAULTS["gpus"],
              tokens_per_step=DEFAULTS["tokens_per_step"], price=None, top=6):
    """(the ranked table for `gpus` GPUs as text, the figure of cost against time for several
    GPU counts, or None when this many GPUs cannot split the batch)."""
    spec, card = model(model_name), find_gpu(gpu)
    card = card if price is None else card.with_price(price)
    work = Workload(spec, spec.seq_len, tokens_per_step)
    plans = plans_around(work, Cluster(card, gpus))
    here = next((p for p in plans if p.cluster.n_gpus == gpus), None)
    if here is None:
        return (f"{gpus} GPUs cannot split a batch of {work.sequences:,} sequences: change the "
                "batch or the GPU count"), None
    budget = TOKENS_PER_PARAM * spec_params(spec)
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    plot_cost_vs_time(plans, budget, (here, here.recommended) if here.ranked else None, ax=ax)
    fig.tight_layout()
    return format_plan(here, top=top), fig


def show_plan(*args, **kwargs):
    """Print `plan_view`'s table and return its figure (a notebook cell then shows it)."""
    text, fig = plan_view(*args, **kwargs)
    print(text)
    return fig


class PlannerWidget(widgets.VBox):
    """Controls for the model, GPU, count, batch and price; the plan redrawn below them."""

    def __init__(self, **overrides):
        self.settings = {**DEFAULTS, **overrides}
        s = self.settings
        self.controls = {
            "model_name": widgets.Dropdown(options=list(MODELS), value=s["model"],
                                           description="model"),
            "gpu": widgets.Dropdown(options=list(GPUS), value=s["gpu"], description="GPU"),
            "gpus": widgets.SelectionSlider(options=[2**k for k in range(3, 15)], value=s["gpus"],
                                            description="GPUs", continuous_update=False),
            "tokens_per_step": widgets.SelectionSlider(
                options=[2**k for k in range(19, 25)], value=s["tokens_per_step"],
                description="tokens/step", continuous_update=False),
        }
        self.output = widgets.Output()
        super().__init__([widgets.HBox(list(self.controls.values())[:2]),
                          widgets.HBox(list(self.controls.values())[2:]), self.output])
        for control in self.controls.values():
            control.observe(lambda change: self.redraw(), names="value")
        self.redraw()

    def redraw(self):
        with self.output:
            clear_output(wait=True)
            text, fig = plan_view(**{k: c.value for k, c in self.controls.items()},
                                  price=self.settings["price"])
            print(text)
            if fig is not None:
                display(fig)
                plt.close(fig)

    def _repr_mimebundle_(self, **kwargs):
        # The controls for a live frontend; the starting setting's figure for one without.
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        s = self.settings
        _, fig = plan_view(s["model"], s["gpu"], s["gpus"], s["tokens_per_step"], s["price"])
        png = io.BytesIO()
        if fig is not None:
            fig.savefig(png, format="png")
            plt.close(fig)
            bundle["image/png"] = base64.b64encode(png.getvalue()).decode("ascii")
        bundle["text/plain"] = f"PlannerWidget: {s['model']} on {s['gpus']} x {s['gpu']}"
        return bundle
