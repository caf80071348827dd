"""Lesson 11 / the planner: what failures cost (dlcourse/planner/goodput.py) against Young's and
Daly's published numbers and a brute-force maximum of the lesson's goodput formula."""

import math

import pytest

from dlcourse.planner import goodput as g


def test_the_llama3_rate_gives_back_its_419_interruptions():
    m = g.mtbf_s(16_384)
    assert 54 * 24 * 3600 / m == pytest.approx(419)
    assert g.interruptions_per_day(16_384) * 54 == pytest.approx(419)
    assert g.interruptions_per_day(8_192) == pytest.approx(g.interruptions_per_day(16_384) / 2)


@pytest.mark.parametrize("m_min,tau_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_matches_his_figures(m_min, tau_min):
    # Daly (2006), Figs. 3-5: delta = 5 min and R = 10 min; the model's optimum, in minutes,
    # rounded as the paper prints them
    assert g.daly_interval_s(5 * 60, m_min * 60) / 60 == pytest.approx(tau_min, abs=0.5)  # as printed


def test_young_interval_maximises_the_goodput_formula():
    delta, mtbf, restart = 30.0, 4 * 3600.0, 600.0
    taus = [1 + i * 0.5 for i in range(20_000)]
    best = max(taus, key=lambda t: g.goodput(t, delta, mtbf, restart))  # brute force
    assert best == pytest.approx(g.young_interval_s(delta, mtbf), abs=0.5)
    assert g.goodput(best, delta, mtbf, restart) == pytest.approx(
        1 - delta / best - (best / 2 + restart) / mtbf)


def test_failure_cost_and_the_planner_factor():
    cost = g.failure_cost(1024, state_bytes=2e12, bandwidth_bytes_s=1e11, restart_s=300)
    assert cost.delta_s == 20.0
    assert cost.interval_s == pytest.approx(math.sqrt(2 * 20.0 * cost.mtbf_s))
    assert cost.lost_per_failure_s == pytest.approx(cost.interval_s / 2 + 300)
    factor = g.goodput_factor(1024, 2e12, 1e11, restart_s=300)
    assert factor == cost.goodput and 0 < factor < 1
    assert g.goodput_factor(1024, 2e12, 1e11, include_failures=False) == 1.0
    with pytest.raises(ValueError, match="interval must be > 0"):
        g.goodput(0, 1, 1)
