"""Lesson 10's divergence finder on every strategy of the catalogue (issue 26: it "reports nothing
for every correct strategy in the tour"; issue 32: the tour, the finder and this test read one
catalogue, `dlcourse.strategies.CATALOGUE`): each entry, run by the finder at its
`finder_ranks`, matches the one-process reference in every compared tensor. A strategy added to
the catalogue is a row here too.

Float64 throughout (DebugConfig), so the finder's own threshold applies unchanged:
`compare.TOLERANCE` = 1e-9 x max(1, |reference|), whose source is compare.py's docstring
(measured on these rows: at most 2.0e-15). Deliberate perturbations of two of the Subjects
that issue 26's coverage work added (DTensor TP, torch pipelining) show that the same test
fails, at the right place, when one gradient is wrong on one rank.

One job per world size, each a module fixture: 2 ranks (24 entries, the DTensor perturbation), 4
(the 2-D grids; torch's pipelining and interleaved 1F1B as the tour runs them at its default 4
ranks, 2 stages x 2 copies; the pipeline perturbation), 8 (the tour's dp x tp x pp grid).
"""

import pytest
import torch.distributed as dist

from dlcourse.debug import SUBJECTS, DebugConfig, find_divergences
from dlcourse.debug.bugs import Bug
from dlcourse.parallel.pipeline import torch_api
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.pipeline.executor import finish_gradients
from dlcourse.parallel.tensor.compare import build as build_tp
from dlcourse.strategies import CATALOGUE
from dlcourse.strategies import tensor as tensor_strategies

NAMES = [name for name, strategy in CATALOGUE.items() if strategy.finder]  # not a kill


def _build_tp_doubling_a_bias_grad(variant, model, group):
    """DTensor TP as the tour builds it, but rank 1 doubles the gradient of the second MLP's
    output bias (a Replicate DTensor: each rank holds its own whole copy) after backward."""
    parallel, loss_fn, gather = build_tp(variant, model, group)
    if dist.get_rank() == 1:
        bias = dict(parallel.named_parameters())["blocks.1.mlp.proj.bias"]
        bias.register_post_accumulate_grad_hook(_double_grad)
    return parallel, loss_fn, gather


def _double_grad(p):
    p.grad.mul_(2)  # in place: a post-accumulate hook returns None


def _finish_doubling_a_weight_grad(stages, group=None, dp_group=None):
    """torch pipelining's step as the library runs it, but after the schedule (and the dp
    average) rank 1 doubles the gradient of its block's first MLP weight."""
    finish_gradients(stages, group, dp_group)
    if dist.get_rank() == 1:
        next(p for s in stages for n, p in s.named_parameters()
             if n.endswith("mlp.fc.weight")).grad.mul_(2)


# the tour's pipeline grid at 4 ranks (`pipeline_grid`, a 2-block GPT): 2 stages x 2 copies
PIPELINE_GRID = RankGrid(dp=2, pp=2)


# strategy -> (the perturbation, where the finder must name it: step, phase, name, ranks)
PERTURBED = {
    # a replicated parameter's gradient read on each rank: only rank 1's copy is wrong
    "DTensor TP": (Bug("DTensor TP", "rank 1 doubles one bias gradient", "",
                       ((tensor_strategies, "build_variant", _build_tp_doubling_a_bias_grad),)),
                   (1, "gradients", "blocks.1.mlp.proj.bias", [1])),
    # a stage's gradient, gathered by `gather_params` over rank 1's pp group: wrong on its
    # ranks, right on the other copy of the pipeline (block s is stage s's)
    "torch pipelining 1F1B": (
        Bug("torch pipelining 1F1B", "rank 1 doubles one weight gradient", "",
            ((torch_api, "finish_gradients", _finish_doubling_a_weight_grad),)),
        (1, "gradients", f"blocks.{PIPELINE_GRID.coords(1)['pp']}.mlp.fc.weight",
         PIPELINE_GRID.axis_ranks("pp", 1))),
}


def _n_params(name):
    """Named tensors of the reference the strategy must equal (the GPT, or its own)."""
    cfg, strategy = DebugConfig(), SUBJECTS[name]
    model = strategy.reference(cfg) if strategy.reference else cfg.new_model()
    return len(dict(model.named_parameters()))


def _run(world_size):
    cases = [(name, None) for name in NAMES if SUBJECTS[name].world_size == world_size]
    cases += [(name, bug) for name, (bug, _) in PERTURBED.items()
              if SUBJECTS[name].world_size == world_size]
    reports = find_divergences(cases, timeout=300)
    return {(name, bug is not None): report for (name, bug), report in zip(cases, reports)}


@pytest.fixture(scope="module")
def reports():
    sizes = sorted({SUBJECTS[name].world_size for name in NAMES})
    return {key: report for size in sizes for key, report in _run(size).items()}


@pytest.mark.parametrize("name", NAMES)
def test_correct_strategy_reports_nothing(reports, name):
    report = reports[(name, False)]
    assert report.first is None, str(report)
    n = _n_params(name)  # every tensor compared, before and after each step, and activations
    assert report.compared["parameters before step 1"] == n, str(report)
    assert report.compared["gradients"] == n, str(report)
    assert report.compared["parameters after the step"] == n, str(report)
    assert report.compared["activations"] > 0, str(report)


@pytest.mark.parametrize("name", list(PERTURBED))
def test_a_perturbed_gradient_is_named_where_it_is(reports, name):
    first = reports[(name, True)].first
    assert first is not None, f"{name}: the finder missed a doubled gradient"
    assert (first.step, first.phase, first.name, first.ranks) == PERTURBED[name][1], str(first)
    assert first.diff > 1e-9 * max(1.0, first.scale)


def test_the_torch_pipeline_report_says_what_it_cannot_compare(reports):
    """Step 1's activations are left out (torch's metadata pass), and the report says so."""
    report = reports[("torch pipelining 1F1B", False)]
    assert "step 1's activations are not compared" in str(report)
