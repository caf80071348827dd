"""What lesson 02's figures and widget are drawn from, and that they draw."""

import matplotlib.pyplot as plt
import pytest

import dlcourse
from dlcourse.collectives.demo import SEMANTICS, before_after, contributors, ring_trace
from dlcourse.plots import collectives as plots
from dlcourse.widgets.collectives import RingWidget

N = 4


def all_ops():
    return {op: before_after(op) for op in SEMANTICS}


@pytest.fixture(scope="module")
def semantics():
    """{op: (befores, afters)}, each a list over ranks, from one run of every op on N ranks."""
    per_rank = dlcourse.launch(all_ops, world_size=N, backend="gloo", timeout=20)
    return {op: ([r[op][0] for r in per_rank], [r[op][1] for r in per_rank]) for op in SEMANTICS}


@pytest.fixture(scope="module")
def trace():
    return dlcourse.launch(ring_trace, world_size=N, backend="gloo", timeout=20)


def column_sums(rows):
    return [sum(column) for column in zip(*rows)]


def test_each_op_does_what_its_definition_says(semantics):
    before, after = semantics["all_reduce"]
    assert after == [column_sums(before)] * N
    before, after = semantics["broadcast"]
    assert after == [before[0]] * N
    before, after = semantics["reduce"]
    assert after == [column_sums(before)] + [None] * (N - 1)
    before, after = semantics["reduce_scatter"]
    assert after == [[total] for total in column_sums(before)]
    before, after = semantics["all_gather"]
    assert after == [[b[0] for b in before]] * N
    before, after = semantics["scatter"]
    assert before[1:] == [None] * (N - 1) and after == [[v] for v in before[0]]
    before, after = semantics["gather"]
    assert after == [[b[0] for b in before]] + [None] * (N - 1)
    before, after = semantics["all_to_all"]
    assert after == [[before[src][dst] for src in range(N)] for dst in range(N)]


def test_digits_name_the_ranks_that_contributed():
    assert contributors(1111) == [0, 1, 2, 3]
    assert contributors(3003) == [0, 3]
    assert contributors(200) == [2]


def test_the_ring_adds_one_rank_per_step_then_copies(trace):
    frames = trace[0]
    assert len(frames) == 1 + 2 * (N - 1)
    total = column_sums([per_rank[0][3] for per_rank in trace])
    for rank, per_rank in enumerate(trace):
        assert per_rank[-1][3] == total  # every rank ends with the sum
        for index, (label, sent, received, values) in enumerate(per_rank[1:], start=1):
            ranks_in = contributors(values[received])
            if index < N:  # reduce-scatter step `index`: the chunk has index + 1 ranks in it
                assert len(ranks_in) == index + 1, (rank, label)
                if index == N - 1:
                    assert received == rank  # and the complete chunk r ends on rank r
            else:
                assert ranks_in == list(range(N)), (rank, label)


def test_figures_draw_from_measured_values(semantics, trace):
    for op, (before, after) in semantics.items():
        fig = plots.plot_collective(op, before, after)
        assert op in fig.texts[0].get_text()
        plt.close(fig)
    plt.close(plots.plot_ring_steps(trace))
    sizes = [1 << 10, 1 << 20]
    plt.close(plots.plot_times(sizes, {"ring": [1e-4, 1e-2]}, {"ring": [2e-4, 9e-3]}))
    plt.close(plots.plot_busbw(sizes, {"ring": [1e-4, 1e-2]}, N))
    plt.close(plots.plot_scaling({"ring": {2: 1e-3}}, {"ring": {2: 1e-3, 8: 2e-3}}, 1 << 20))


def test_ring_widget_steps_and_shows_a_picture_without_a_kernel(trace):
    widget = RingWidget(trace)
    widget.slider.value = 2
    assert "reduce-scatter step 2" in widget.caption.value
    widget.slider.value = 2 * (N - 1)
    assert "all-gather step 3" in widget.caption.value
    bundle = widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["image/png"]
    plt.close("all")
