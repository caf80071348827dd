"""The planner's figure and widget (`dlcourse/plots/planner.py`, `dlcourse/widgets/planner.py`):
what they draw comes from the plans, and the widget keeps a picture for a notebook without a
kernel."""

import matplotlib

matplotlib.use("Agg")

from dlcourse.planner.catalog import model  # noqa: E402
from dlcourse.planner.hardware import Cluster, gpu  # noqa: E402
from dlcourse.planner.layouts import Workload  # noqa: E402
from dlcourse.plots.planner import train_hours_and_dollars  # noqa: E402
from dlcourse.widgets.planner import PlannerWidget, plan_view, plans_around  # noqa: E402


def test_plans_around_skip_counts_that_cannot_split_the_batch():
    work = Workload(model("gpt-2-small"), 1024, 16 * 1024)
    counts = [p.cluster.n_gpus for p in plans_around(work, Cluster(gpu("a100-40gb"), 64))]
    # 16 sequences cannot keep 128 or 256 GPUs busy: tp is at most 4 (12 heads), pp at most
    # 12 (layers) and needs as many micro-batches as stages
    assert counts == [16, 32, 64]


def test_hours_and_dollars_are_tokens_over_speed_and_hours_times_price():
    work = Workload(model("llama-2-7b"), 4096, 2**22)
    p = plans_around(work, Cluster(gpu("h100"), 64), factors=(1,))[0]
    e = p.ranked[0]
    hours, dollars = train_hours_and_dollars(e, p, 1e9)
    assert hours == 1e9 / e.tokens_per_s / 3600
    assert dollars == hours * 64 * gpu("h100").price


def test_the_view_titles_and_labels_its_figure_and_ranks_the_table():
    text, fig = plan_view("Llama-2 7B", gpu="a100-80gb", gpus=32)
    ax = fig.axes[0]
    assert ax.get_title() and "days to train" in ax.get_xlabel() and ax.get_ylabel()
    assert "Recommended" in text
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "32 x a100-80gb" in labels and "Pareto front" in labels


def test_the_widget_saves_a_picture_for_a_notebook_without_a_kernel():
    bundle = PlannerWidget(model="GPT-2 small", gpus=8, tokens_per_step=2**19)._repr_mimebundle_()
    assert bundle["image/png"] and "application/vnd.jupyter.widget-view+json" in bundle
