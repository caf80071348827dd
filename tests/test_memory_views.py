"""Lesson 01's figures and calculator widget draw what they are given."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dlcourse.memory import REAL_MODELS, MemoryParts, memory_per_gpu  # noqa: E402
from dlcourse.plots.memory import (PARTS, byte_unit, plot_fit, plot_measured_vs_estimated,  # noqa: E402
                                   plot_parts)
from dlcourse.widgets.memory import memory_calculator, show_setting  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_every_part_has_a_colour():
    assert set(PARTS) == set(MemoryParts().as_dict())


def test_stacked_bars_add_up_to_the_totals():
    columns = {"a": MemoryParts(params=3e6, grads=3e6, optimizer=6e6),
               "b": MemoryParts(params=1e6, activations=2.5e6)}
    ax = plot_parts(columns, title="t")
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0), bar.get_y() + bar.get_height())
    assert byte_unit(12e6) == (1e6, "MB")
    assert tops == {0: pytest.approx(12), 1: pytest.approx(3.5)}


def test_ratio_labels_are_measured_over_estimated():
    measured = {"forward": MemoryParts(params=100, activations=98)}
    estimated = {"forward": MemoryParts(params=100, activations=100)}
    ax = plot_measured_vs_estimated(measured, estimated, title="t")
    assert [t.get_text() for t in ax.texts] == [f"{198 / 200:.3f}"]


def test_fit_plot_marks_every_card():
    ax = plot_fit({"x": MemoryParts(params=5e9)}, cards=(24, 80), title="t")
    texts = [t.get_text() for t in ax.texts]
    assert [t for t in texts if t.endswith(" GB") and not t.startswith(" ")] == ["24 GB", "80 GB"]
    assert " 5.00 GB" in texts  # the bar's total, written at its end


def test_fit_plot_writes_a_part_inside_its_segment_only_where_it_has_room():
    ax = plot_fit({"x": MemoryParts(params=30e9, grads=1e9)}, cards=(80,), title="t")
    texts = [t.get_text() for t in ax.texts]
    assert "30.0" in texts and "1.0" not in texts  # 1 GB is under a tenth of the 80 GB axis


def test_show_setting_reports_the_calculator_numbers(capsys):
    parts = show_setting("GPT-2 small", batch=2, seq_len=512, dp=4, zero_stage=2)
    expected = memory_per_gpu(REAL_MODELS["GPT-2 small"], batch=2, seq_len=512, dp=4, zero_stage=2)
    assert parts == expected
    assert f"= {expected.total / 1e9:.1f} GB" in capsys.readouterr().out


def test_calculator_widget_starts_where_asked_and_refuses_unknown_settings():
    widget = memory_calculator(model="GPT-2 XL", dp=1)
    values = {c.description: c.value for box in widget.children[:3] for c in box.children}
    assert values["model"] == "GPT-2 XL" and values["dp ranks"] == 1
    with pytest.raises(TypeError, match="unknown settings"):
        memory_calculator(gpus=8)


def test_the_calculator_saves_a_picture_not_its_controls_text():
    bundle = memory_calculator(model="GPT-2 XL", dp=1)._repr_mimebundle_()
    assert bundle["image/png"] and "application/vnd.jupyter.widget-view+json" in bundle
    assert "VBox" not in bundle["text/plain"] and "GB per GPU" in bundle["text/plain"]
