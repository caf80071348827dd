"""The planner (`dlcourse/planner/`): its pieces against lessons 01-02's own formulas, the rules a
layout must obey, published training runs, and `dlcourse plan` as a user types it."""

from dataclasses import replace

import pytest

from dlcourse.cli import main
from dlcourse.collectives import predict_time
from dlcourse.memory import REAL_MODELS, memory_per_gpu as lesson01_memory_per_gpu, spec_params
from dlcourse.planner.catalog import model
from dlcourse.planner.estimate import estimate, memory_per_gpu, ring_time, stage_params
from dlcourse.planner.hardware import Cluster, gpu
from dlcourse.planner.layouts import Layout, Workload, layouts, problems
from dlcourse.planner.published import RUNS, TOLERANCE, candidates, predict
from dlcourse.planner.rank import format_plan, pareto, plan, simplicity

LLAMA7 = REAL_MODELS["Llama-2 7B"]
GPT2 = REAL_MODELS["GPT-2 small"]


@pytest.mark.parametrize("spec", [GPT2, LLAMA7, REAL_MODELS["Llama-2 70B"]])
def test_one_gpu_holds_every_parameter_once(spec):
    assert stage_params(spec, Layout(1, 1, 1)) == spec_params(spec)


def test_tensor_and_pipeline_splits_add_back_to_the_model():
    """tp ranks of every stage hold the split matrices once between them, the norms each."""
    spec = LLAMA7
    whole = spec_params(spec)
    split = stage_params(spec, Layout(1, 4, 1))
    norms = (2 * spec.n_layers + 1) * spec.hidden  # RMSNorm scales, replicated on every tp rank
    assert 4 * split == pytest.approx(whole + 3 * norms)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_without_parallelism_memory_is_lesson_01s_calculator(recompute):
    work = Workload(GPT2, 1024, 4 * 1024)
    ours = memory_per_gpu(work, Layout(1, 1, 1, micro_batch=4, recompute=recompute))
    lesson01 = lesson01_memory_per_gpu(GPT2, batch=4, seq_len=1024, recompute=recompute).total
    assert ours == pytest.approx(lesson01, rel=1e-12)


def test_ring_times_are_lesson_02s_alpha_beta_model():
    assert ring_time("all_reduce", 1e6, 4, 1e-5, 1e9) == predict_time("ring all_reduce", 1e6, 4,
                                                                      1e-5, 1e-9)
    assert ring_time("all_gather", 1e6, 1, 1e-5, 1e9) == 0.0


def test_the_bubble_stretches_compute_by_p_minus_1_over_v_m():
    work = Workload(LLAMA7, 4096, 64 * 4096)
    cluster = Cluster(gpu("h100"), 16)
    flat = estimate(work, Layout(16, 1, 1, micro_batch=1, micro_batches=4), cluster)
    for v, m, pp in [(1, 16, 4), (2, 16, 4), (1, 8, 8)]:
        layout = Layout(16 // pp, 1, pp, micro_batch=64 // (16 // pp) // m, micro_batches=m,
                        interleave=v)
        piped = estimate(work, layout, cluster)
        assert piped.compute_time / flat.compute_time == pytest.approx(1 + (pp - 1) / (v * m))


@pytest.mark.parametrize("layout, says", [
    (Layout(1, 16, 1, micro_batches=16), "tp 16 is more than the 8 GPUs of a node"),
    (Layout(2, 8, 1, micro_batches=8), "tp 8 does not divide n_heads 12"),
    (Layout(1, 1, 16, micro_batches=16), "pp 16 x v 1 chunks is more than the 12 layers"),
    (Layout(4, 1, 4, micro_batches=2, micro_batch=2), "2 micro-batches cannot keep 4 stages busy"),
    (Layout(16, 1, 1, micro_batches=3), "= 49,152 tokens, not the batch's 16,384"),
    (Layout(1, 2, 8, zero_stage=1, micro_batches=16), "ZeRO shards over data-parallel ranks"),
])
def test_a_broken_rule_is_named_with_its_arithmetic(layout, says):
    work = Workload(GPT2, 1024, 16 * 1024)
    found = problems(layout, work, Cluster(gpu("a100-80gb"), 16))
    assert any(says in p for p in found), found


def test_every_enumerated_layout_obeys_the_rules_and_all_sizes_appear():
    work = Workload(GPT2, 1024, 32 * 1024)
    cluster = Cluster(gpu("a100-40gb"), 8)
    found = list(layouts(work, cluster))
    assert found and all(not problems(L, work, cluster) for L in found)
    assert {(L.dp, L.tp, L.pp) for L in found} >= {(8, 1, 1), (1, 4, 2), (2, 2, 2), (1, 1, 8)}


def test_the_recommendation_is_the_simplest_near_the_cheapest():
    p = plan(Workload(LLAMA7, 4096, 4 * 2**20), Cluster(gpu("h100"), 64))
    costs = [e.dollars_per_m_tokens for e in p.ranked]
    assert costs == sorted(costs) and all(e.fits for e in p.ranked)
    near = [e for e in p.ranked if e.dollars_per_m_tokens <= costs[0] * 1.1]
    assert simplicity(p.recommended.layout) == min(simplicity(e.layout) for e in near)
    assert "Recommended" in format_plan(p)


def test_a_model_that_fits_nowhere_says_why_and_what_would_fit():
    p = plan(Workload(REAL_MODELS["Llama-2 70B"], 4096, 2**20), Cluster(gpu("rtx-4090"), 8))
    assert not p.ranked
    text = format_plan(p)
    assert "Nothing fits" in text and "GB a GPU, more than 90% of 24 GB" in text
    assert any("rtx-4090 GPUs would fit" in a for a in p.advice)  # more of the same GPU


def test_pareto_drops_what_another_point_beats_on_both():
    points = [(10, 5, "a"), (12, 4, "b"), (11, 6, "dominated by a"), (20, 4, "slower b")]
    assert [label for *_, label in pareto(points)] == ["a", "b"]


def test_published_runs_are_valid_layouts_and_predicted_within_25_percent(capsys):
    rows = []
    for run in RUNS:
        assert any(True for _ in candidates(run)), f"{run.source}: the published grid is invalid"
        best, predicted = predict(run)
        assert best is not None, f"{run.source}: no setting of the published grid fits"
        error = predicted / run.value - 1
        rows.append((run, best, predicted, error))
    with capsys.disabled():
        print("\nplanner vs published runs")
        for run, best, predicted, error in rows:
            print(f"  {run.source:32} {run.work.model.name:22} {run.layout.describe():32} "
                  f"{run.metric} published {run.value:g}, predicted {predicted:.3g} "
                  f"({error:+.0%}) as {best.layout.describe()}")
    assert all(abs(error) <= TOLERANCE for *_, error in rows), rows


def test_the_published_check_can_fail():
    """A run reported twice as fast as it was is caught."""
    run = replace(RUNS[0], value=RUNS[0].value * 2)
    _, predicted = predict(run)
    assert abs(predicted / run.value - 1) > TOLERANCE


def test_models_are_found_by_name_and_unknown_ones_listed():
    assert model("LLAMA-2 7b") is LLAMA7
    with pytest.raises(ValueError, match="known: gpt-2-small"):
        model("gpt-5")


def test_dlcourse_plan_prints_the_table(capsys):
    assert main(["plan", "--model", "llama-2-7b", "--gpus", "64", "--gpu", "h100",
                 "--tokens-per-step", "4M", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Llama-2 7B, 4,194,304 tokens a step" in out and "Recommended" in out


@pytest.mark.parametrize("argv, says", [
    (["--model", "llama-2-7b", "--gpus", "8", "--tokens-per-step", "1000"],
     "not a whole number of 4096-token sequences"),
    (["--model", "llama-2-7b", "--gpus", "0", "--tokens-per-step", "4M"],
     "Cluster.n_gpus must be a whole number >= 1"),
    (["--model", "llama-2-7b", "--gpus", "8", "--gpu", "tpu", "--tokens-per-step", "4M"],
     "unknown GPU 'tpu'"),
])
def test_dlcourse_plan_refuses_bad_input_saying_what_to_do(argv, says, capsys):
    assert main(["plan", *argv]) == 2
    assert says in capsys.readouterr().err


# ---------------------------------------------------------------- in flight: lesson 06's count

@pytest.mark.parametrize("pp, m, v", [(2, 2, 1), (4, 8, 1), (4, 3, 1), (8, 32, 1), (4, 8, 2),
                                      (4, 8, 4), (8, 16, 2), (2, 4, 4)])
def test_the_first_stage_holds_what_lesson_06s_schedule_holds(pp, m, v):
    """The planner's activations are lesson 06's `in_flight_peak` over lesson 06's own action
    lists, an interleaved chunk costing 1/v of a stage; and for m >= p they are the papers'
    closed forms: p micro-batches for plain 1F1B (no extra factor), p (1 + (p-1)/(p v))
    interleaved (Narayanan et al. 2021; Korthikanti et al. 2022 §4.2.3)."""
    from dlcourse.memory.accounting import activation_bytes
    from dlcourse.parallel.pipeline.measure import in_flight_peak
    from dlcourse.parallel.pipeline.schedules import interleaved_1f1b, one_f_one_b
    from dlcourse.planner.estimate import activations_in_flight, in_flight_micro_batches

    spec = replace(LLAMA7, n_layers=pp * v * 2, vocab_size=8)  # whole chunks; a tiny loss
    work = Workload(spec, 512, 512 * 8 * m)
    layout = Layout(8, 1, pp, micro_batch=1, micro_batches=m, interleave=v)
    actions = (one_f_one_b(0, pp, m) if v == 1 else interleaved_1f1b(0, pp, m, v))
    chunk = 2 * activation_bytes(512, 1, spec.hidden, spec.n_heads)  # two layers a chunk
    lesson06 = in_flight_peak(actions, {s: chunk for s in range(pp * v)})
    assert activations_in_flight(work, layout) == pytest.approx(lesson06, rel=1e-12)
    stage_micro_batches = in_flight_micro_batches(pp, m, v)
    if m >= pp:
        paper = pp if v == 1 else pp * (1 + (pp - 1) / (pp * v))
        assert stage_micro_batches == pytest.approx(paper)
    else:  # fewer micro-batches than stages: each one is in flight at once
        assert stage_micro_batches == m


def test_interleaving_costs_memory_it_does_not_save_it():
    work = Workload(REAL_MODELS["Llama-2 70B"], 4096, 1024 * 4096)
    held = [memory_per_gpu(work, Layout(32, 2, 8, zero_stage=1, micro_batches=32, interleave=v,
                                        recompute="selective")) for v in (1, 2, 4)]
    assert held[0] < held[1] and held[0] < held[2]
