"""The band a plan of a mixture of experts is read with (`planner/moe_band.py`, issue 34): the
planner's throughput errors on the published MoE runs that are not named misses, used in the
tie rule and the printed cost band; dense plans keep the dense runs' band (lesson 07)."""

import json
from pathlib import Path

import pytest

from dlcourse.planner import moe_band, published
from dlcourse.planner.catalog import model
from dlcourse.planner.hardware import Cluster, gpu
from dlcourse.planner.layouts import Workload
from dlcourse.planner.published_moe import RUNS, held_against
from dlcourse.planner.rank import Plan, format_plan, plan, simplicity, tie_band

LESSON_07 = Path(__file__).resolve().parents[1] / "lessons" / "07_combining.ipynb"
MIXTRAL = Workload(model("mixtral-8x7b"), 4096, 2 ** 20)  # 256 sequences a step
H100_64 = Cluster(gpu("h100"), 64)


@pytest.fixture(scope="module")
def mixtral_plan():
    return plan(MIXTRAL, H100_64)


def _throughput_errors():
    """{run name: published step time / the planner's - 1}, from `held_against` directly."""
    found = {run.name: held_against(run) for run in RUNS}
    return {name: f["published"] / f["planner"] - 1 for name, f in found.items()}


def test_the_moe_band_is_the_spread_of_the_runs_that_are_not_named_misses():
    errors = _throughput_errors()
    kept = [errors[run.name] for run in RUNS if not run.miss]
    assert len(kept) == 5 and moe_band.error_band() == pytest.approx((min(kept), max(kept)))
    low, high = min(kept), max(kept)
    assert tie_band(MIXTRAL) == pytest.approx(max(-low, high))
    # the dense band is the dense runs' and stays so for a dense model (and for none)
    dense_low, dense_high = published.error_band()
    assert tie_band() == tie_band(Workload(model("llama-2-7b"), 4096, 2 ** 20)) == \
        pytest.approx(max(-dense_low, dense_high))
    assert tie_band(MIXTRAL) > tie_band()  # the MoE runs' spread is the wider
    # every named miss lies outside the band and is listed, with its reason
    misses = [run for run in RUNS if run.miss]
    assert misses and all(not low <= errors[run.name] <= high for run in misses)
    assert [run for run, _ in moe_band.named_misses()] == misses
    # moe_band's docstring: the misses are the planner too fast by 77% and 92% in throughput
    assert sorted(round(100 * errors[run.name]) for run in misses) == [77, 92]


def test_every_named_miss_is_told_apart_by_its_expert_gemm_rows():
    """`moe_band.regime` measures a layout by one number, the rows an expert a GEMM, because
    that is the reason every named miss gives; a miss with another reason needs another."""
    misses = [run for run in RUNS if run.miss]
    assert all("rows an expert a GEMM" in run.miss for run in misses)
    rows = {run.name: rows for run, _, rows in moe_band.held()}
    assert max(rows[r.name] for r in misses) < min(rows[r.name] for r in RUNS if not r.miss)
    # its docstring: 1,024 and 512 rows, against 4,096 and more for every run in the band
    assert sorted(rows[r.name] for r in misses) == [512, 1024]
    assert min(rows[r.name] for r in RUNS if not r.miss) == 4096


def test_a_layout_within_the_moe_band_of_the_cheapest_is_printed_as_a_tie(mixtral_plan):
    """Two Mixtral layouts the band backs, the dearer between the dense band and the MoE band
    above the cheaper: a tie for an MoE (the dense band would have split them)."""
    backed = [e for e in mixtral_plan.ranked if moe_band.regime(MIXTRAL, e.layout)[0] == "band"]
    cheap = backed[0]
    dear = next((e for e in backed if (1 + tie_band()) * cheap.dollars_per_m_tokens
                 < e.dollars_per_m_tokens <= (1 + tie_band(MIXTRAL)) * cheap.dollars_per_m_tokens),
                None)
    assert dear is not None, "no backed layout between the dense band and the MoE band"
    pair = Plan(MIXTRAL, H100_64, [cheap, dear])
    assert set(map(id, pair.tied)) == {id(cheap), id(dear)}
    text = format_plan(pair)
    assert f"inside the planner's error of {tie_band(MIXTRAL):.0%} on the MoE runs" in text
    assert "they tie" in text and "2 named misses aside" in text
    for run, error in moe_band.named_misses():
        assert f"a named miss: {run.name}, planner {error:+.0%}" in text


def test_an_moe_plan_ties_within_its_band_and_takes_a_backed_layout_first(mixtral_plan):
    """The tie is every layout within the MoE band of the cheapest; on 64 H100s the cheapest
    layout gives each expert 512 rows a GEMM (tp 2, no ep: 2 x 4,096 / 2 / 8), as few as a
    named miss's, and is passed over for one the runs back, said so in the output."""
    p = mixtral_plan
    limit = p.cheapest.dollars_per_m_tokens * (1 + tie_band(MIXTRAL))
    assert {id(e) for e in p.tied} == {id(e) for e in p.ranked if e.dollars_per_m_tokens <= limit}
    spec, c = MIXTRAL.model, p.cheapest.layout
    rows = spec.top_k * c.micro_batch * 4096 / c.tp / spec.n_experts  # ep 1: no imbalance
    assert c.ep == 1 and moe_band.expert_rows(MIXTRAL, c) == rows == 512
    assert moe_band.regime(MIXTRAL, c)[0] == "miss"
    r = p.recommended
    assert moe_band.regime(MIXTRAL, r.layout)[0] == "band" and r is not p.cheapest
    same_trust = [e for e in p.tied if moe_band.regime(MIXTRAL, e.layout)[0] == "band"]
    assert simplicity(r.layout) == min(simplicity(e.layout) for e in same_trust)
    text = format_plan(p)
    assert f"the cheapest, {c.describe()}" in text and "as few as a named miss's" in text


def _lesson_07_outputs():
    cells = json.loads(LESSON_07.read_text())["cells"]
    return ["".join(o.get("text", "")) for cell in cells if cell["cell_type"] == "code"
            for o in cell.get("outputs", [])]


@pytest.mark.parametrize("name, gpus", [("llama-2-7b", 64), ("llama-2-70b", 512)])
def test_lesson_07s_dense_recommendations_are_unchanged(name, gpus):
    """The dense plans lesson 07 prints (its committed outputs): the same recommendation, cost
    band and reasons, word for word, and the band is the dense runs'."""
    p = plan(Workload(model(name), 4096, 4 * 2 ** 20), Cluster(gpu("h100"), gpus))
    text = format_plan(p, top=6)
    tail = text[text.index("Recommended:"):]
    assert any(tail in out for out in _lesson_07_outputs()), tail
    assert f"error on {len(published.RUNS)} published runs" in tail
