"""The memory calculator of lesson 01: pick a real model and a training setup with sliders, see
the bytes each GPU holds by part and which cards that fits.

    memory_calculator()                      # the widget (JupyterLab; a picture without a kernel)
    show_setting("Llama-2 7B", dp=8, zero_stage=3)  # the same view for one setting, no widget

The numbers come from `dlcourse.memory.calculator.memory_per_gpu` (ZeRO's model state plus
Korthikanti's activations); the picture from `dlcourse.plots.memory.plot_fit`.
"""

import base64
import io

import ipywidgets as widgets
import matplotlib.pyplot as plt

from dlcourse.memory.calculator import CARDS_GB, REAL_MODELS, fits, memory_per_gpu, spec_params
from dlcourse.plots.memory import plot_fit

DEFAULTS = dict(model="Llama-2 7B", batch=1, seq_len=4096, mixed_precision=True, dp=8,
                zero_stage=3, recompute="selective")


def show_setting(model=DEFAULTS["model"], batch=1, seq_len=4096, mixed_precision=True, dp=1,
                 zero_stage=0, recompute="none"):
    """Print one setting's bytes per GPU and the cards it fits, and draw its bar."""
    spec = REAL_MODELS[model]
    parts = memory_per_gpu(spec, batch=batch, seq_len=seq_len, mixed_precision=mixed_precision,
                           dp=dp, zero_stage=zero_stage, recompute=recompute)
    precision = "bf16 mixed precision" if mixed_precision else "fp32"
    print(f"{model}: {spec_params(spec) / 1e9:.2f} B parameters; batch {batch} x {seq_len} "
          f"tokens, {precision}, {dp} data-parallel ranks, ZeRO stage {zero_stage}, "
          f"recompute {recompute}")
    print(f"per GPU: {parts.model_state / 1e9:.1f} GB model state + "
          f"{parts.activations / 1e9:.1f} GB activations = {parts.total / 1e9:.1f} GB")
    verdicts = [f"{gb} GB {'yes' if ok else 'no'}" for gb, ok in fits(parts).items()]
    print("fits on: " + ", ".join(verdicts))
    plot_fit({model: parts}, cards=CARDS_GB, title=f"{model}: bytes per GPU by part")
    plt.show()
    return parts


def _controls(defaults):
    powers = [2**k for k in range(11)]  # 1 .. 1024
    return {
        "model": widgets.Dropdown(options=list(REAL_MODELS), value=defaults["model"],
                                  description="model"),
        "batch": widgets.IntSlider(value=defaults["batch"], min=1, max=32,
                                   description="batch / GPU"),
        "seq_len": widgets.SelectionSlider(options=[256 * 2**k for k in range(6)],
                                           value=defaults["seq_len"], description="seq_len"),
        "mixed_precision": widgets.ToggleButtons(options=[("bf16 mixed", True), ("fp32", False)],
                                                 value=defaults["mixed_precision"],
                                                 description="precision"),
        "dp": widgets.SelectionSlider(options=powers, value=defaults["dp"], description="dp ranks"),
        "zero_stage": widgets.ToggleButtons(options=[0, 1, 2, 3], value=defaults["zero_stage"],
                                            description="ZeRO stage"),
        "recompute": widgets.ToggleButtons(options=["none", "selective", "full"],
                                           value=defaults["recompute"], description="recompute"),
    }


def memory_calculator(**overrides):
    """The calculator widget: controls on top, `show_setting` redrawn below on every change.
    Keyword arguments set the starting values (see `DEFAULTS`)."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"memory_calculator got unknown settings {sorted(unknown)}; "
                        f"known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **overrides}
    controls = _controls(settings)
    output = widgets.interactive_output(show_setting, controls)
    names = list(controls)
    return Calculator([widgets.HBox([controls[n] for n in names[:3]]),
                       widgets.HBox([controls[n] for n in names[3:5]]),
                       widgets.HBox([controls[n] for n in names[5:]]), output], settings)


class Calculator(widgets.VBox):
    """The calculator's controls and output; saved in a notebook without a kernel (GitHub, a
    headless run), it shows the starting setting's figure instead of its controls."""

    def __init__(self, children, settings):
        super().__init__(children)
        self.settings = settings

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        s = self.settings
        parts = memory_per_gpu(REAL_MODELS[s["model"]], batch=s["batch"], seq_len=s["seq_len"],
                               mixed_precision=s["mixed_precision"], dp=s["dp"],
                               zero_stage=s["zero_stage"], recompute=s["recompute"])
        fig, ax = plt.subplots(figsize=(7, 1.9))
        plot_fit({s["model"]: parts}, cards=CARDS_GB, ax=ax,
                 title=f"{s['model']}: bytes per GPU by part (dp {s['dp']}, ZeRO stage "
                       f"{s['zero_stage']}, recompute {s['recompute']})")
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png")
        plt.close(fig)
        bundle["image/png"] = base64.b64encode(png.getvalue()).decode("ascii")
        bundle["text/plain"] = (f"memory calculator: {s['model']}, {parts.total / 1e9:.1f} GB "
                                "per GPU")
        return bundle
