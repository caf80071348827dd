"""The planner's goodput term (`dlcourse/planner/failures.py`): tokens/s and $ per million tokens
at scale include failures, against lesson 11's formula written out here; `--no-failures` and
`include_failures=False` leave it out; the published-run comparison never includes it."""

import math
import random

import pytest

from dlcourse.cli import main
from dlcourse.memory.calculator import spec_params
from dlcourse.planner import goodput
from dlcourse.planner.catalog import model
from dlcourse.planner.estimate import estimate
from dlcourse.planner.failures import cost_at_scale, goodput_line, with_failures
from dlcourse.planner.hardware import Cluster, gpu
from dlcourse.planner.layouts import Workload, layouts
from dlcourse.planner.published import RUNS, best_candidate, in_metric, predict
from dlcourse.planner.rank import format_plan, plan


def lesson11_goodput(n_gpus, n_params):
    """Lesson 11's model, written out: Llama 3's 419 unexpected interruptions in 54 days, on
    16,384 GPUs by the course's assumption (the paper says "up to 16K"); 14 bytes a parameter
    at 2 TB/s; Daly's interval; a 10-minute restart."""
    m = 3600 / (n_gpus * 419 / (16_384 * 54 * 24))
    delta = 14 * n_params / 2e12
    x = delta / (2 * m)
    tau = math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta
    return 1 - delta / tau - (tau / 2 + 600) / m


@pytest.mark.parametrize("name, n_gpus", [("llama-2-70b", 512), ("llama-3-405b", 16_384)])
def test_tokens_per_s_with_failures_is_without_times_lesson_11s_goodput(name, n_gpus):
    spec = model(name)
    work, cluster = Workload(spec, 4096, 4096 * 4096), Cluster(gpu("h100"), n_gpus)
    drawn = random.Random(n_gpus).choice(list(layouts(work, cluster, micro_batch_sizes=(1,),
                                                      recomputes=("none",), interleaves=(1,))))
    in_step = estimate(work, drawn, cluster)
    cost = cost_at_scale(work, cluster)
    g = lesson11_goodput(n_gpus, spec_params(spec))
    assert 0 < g < 1
    assert cost.goodput == pytest.approx(g, rel=1e-12)
    assert cost.goodput == goodput.goodput_factor(n_gpus, 14 * spec_params(spec), 2e12, 600,
                                                  interval="daly")
    e = with_failures(in_step, cost)
    assert e.tokens_per_s == pytest.approx(in_step.tokens_per_s * g, rel=1e-12)
    assert e.dollars_per_m_tokens == pytest.approx(in_step.dollars_per_m_tokens / g, rel=1e-12)
    assert (e.mfu, e.step_time, e.memory) == (in_step.mfu, in_step.step_time, in_step.memory)


def test_plan_includes_failures_by_default_and_leaves_them_out_when_asked():
    work, cluster = Workload(model("llama-2-7b"), 4096, 4 * 2**20), Cluster(gpu("h100"), 64)
    choices = dict(micro_batch_sizes=(2,), recomputes=("none",), interleaves=(1,))
    with_f = plan(work, cluster, **choices)
    without = plan(work, cluster, include_failures=False, **choices)
    g = lesson11_goodput(64, spec_params(work.model))
    assert without.failures is None and with_f.failures.goodput == pytest.approx(g, rel=1e-12)
    assert [e.layout for e in with_f.ranked] == [e.layout for e in without.ranked]
    for a, b in zip(with_f.ranked, without.ranked):
        assert b == estimate(work, b.layout, cluster)  # left out: the in-step estimate itself
        assert a.tokens_per_s == pytest.approx(b.tokens_per_s * g, rel=1e-12)
        assert a.dollars_per_m_tokens == pytest.approx(b.dollars_per_m_tokens / g, rel=1e-12)
        assert a.mfu == b.mfu
    assert goodput_line(with_f.failures) in format_plan(with_f)
    assert f"goodput {g:.2%} at 64 GPUs" in format_plan(with_f)
    assert "goodput" not in format_plan(without).replace("leave failures out", "")


def _first_row_tokens_per_s(text):
    header = next(i for i, line in enumerate(text.splitlines()) if line.startswith("layout"))
    row = text.splitlines()[header + 1].split()
    return float(row[-4].replace(",", ""))  # ... tokens/s, MFU, $/M tok, simplicity


def test_dlcourse_plan_no_failures_flag(capsys):
    argv = ["plan", "--model", "llama-2-7b", "--gpus", "64", "--tokens-per-step", "4M", "--top",
            "1", "--recompute", "none", "--mlp", "fused"]
    assert main(argv) == 0
    on = capsys.readouterr().out
    assert main([*argv, "--no-failures"]) == 0
    off = capsys.readouterr().out
    g = lesson11_goodput(64, spec_params(model("llama-2-7b")))
    assert "--no-failures leaves it out" in on and f"goodput {g:.2%}" in on
    assert "leave failures out (--no-failures)" in off and "goodput " not in off
    ratio = _first_row_tokens_per_s(on) / _first_row_tokens_per_s(off)
    assert ratio == pytest.approx(g, abs=2e-6)  # both printed to the token


@pytest.mark.parametrize("name", ["Llama 3 405B on 16384",
                                  next(r.name for r in RUNS if r.metric == "tokens/s/GPU")])
def test_published_runs_are_compared_without_failures(name):
    """Published throughputs are measured over steps in which nothing failed: the comparison's
    prediction is the in-step estimate's, never one times goodput."""
    run = next(r for r in RUNS if r.name == name)
    work, best = best_candidate(run)
    assert best.goodput == 1.0 and best == estimate(work, best.layout, run.cluster)
    assert predict(run)[1] == in_metric(run, best)
    assert cost_at_scale(run.work, run.cluster).goodput < 1  # a term there was to leave out
