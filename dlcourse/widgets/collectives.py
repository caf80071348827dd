"""Step through a ring all-reduce chunk by chunk, from values real ranks held (lesson 02).

    trace = dlcourse.launch(ring_trace)     # dlcourse.collectives.demo.ring_trace, on 4 ranks
    RingWidget(trace)                       # a slider over the 2(n - 1) steps

Without a live kernel (a notebook rendered on GitHub, or executed headless under nbval) a
frontend cannot draw the slider; the widget then also offers every step as one static picture.
"""

import base64
import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import clear_output, display

from dlcourse.plots.collectives import DPI, plot_ring_step, plot_ring_steps

# What happens in each phase, as the caption under the slider says it.
PHASE_TEXT = {
    "start": "Each rank holds its own tensor, cut into {n} chunks (one per rank).",
    "reduce-scatter": "Each rank sends one chunk (dashed) to the next rank, which adds its own "
                      "copy of that chunk to it (framed). After {last} steps rank r holds chunk r "
                      "summed over all ranks.",
    "all-gather": "Each rank passes a complete chunk (dashed) to the next rank, which copies it "
                  "into place (framed). After {last} steps every rank holds every complete chunk.",
}


class RingWidget(widgets.VBox):
    """A slider over the steps of a ring all-reduce; the figure shows every rank's chunks."""

    def __init__(self, trace):
        self.trace = trace  # per rank: collectives.demo.ring_trace's list
        self.slider = widgets.IntSlider(value=0, min=0, max=len(trace[0]) - 1,
                                        description="step", continuous_update=False)
        self.caption = widgets.HTML()
        self.figure = widgets.Output()
        super().__init__([self.slider, self.caption, self.figure])
        self.slider.observe(lambda change: self.show(change["new"]), names="value")
        self.show(0)

    def show(self, index):
        """Draw frame `index` and its caption."""
        self.caption.value = f"<b>{self.trace[0][index][0]}</b>: {self.describe(index)}"
        with self.figure:
            clear_output(wait=True)
            # 5.6 inches: the chunks and, right of them, the arrows of what each rank sent
            fig, ax = plt.subplots(figsize=(5.6, 0.55 * len(self.trace) + 0.8), dpi=DPI)
            plot_ring_step(self.trace, index, ax)
            fig.tight_layout()
            display(fig)
            plt.close(fig)

    def describe(self, index):
        label = self.trace[0][index][0]
        phase = label.split(" step")[0]
        n = len(self.trace)
        return PHASE_TEXT[phase].format(n=n, last=n - 1)

    def _repr_mimebundle_(self, **kwargs):
        # The slider for a live frontend, and every step as a PNG for one without a kernel.
        bundle = super()._repr_mimebundle_(**kwargs) or {}
        fig = plot_ring_steps(self.trace)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI)
        plt.close(fig)
        bundle["image/png"] = base64.b64encode(png.getvalue()).decode("ascii")
        bundle["text/plain"] = (f"RingWidget: ring all-reduce on {len(self.trace)} ranks, "
                                f"{len(self.trace[0]) - 1} steps")
        return bundle
