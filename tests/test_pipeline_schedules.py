"""Lesson 06's schedules as data, without ranks: the action lists equal torch's own schedule
tables, every list is a valid schedule, and the bubble and memory they predict follow the
papers' formulas. (The runs on real ranks are in test_pipeline.py.)"""

import pytest
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

from dlcourse.parallel.pipeline import SCHEDULES, gpipe, interleaved_1f1b, one_f_one_b, zb_h1
from dlcourse.parallel.pipeline.measure import (UNIT_TIMES, bubble_formula, bubble_fraction,
                                                bubble_time, bubble_time_formula,
                                                first_rank_peak_formula, in_flight_peak, simulate,
                                                stage_times_of)
from dlcourse.parallel.pipeline.stages import stage_boundaries

SIZES = [(2, 2), (2, 5), (4, 4), (4, 8), (4, 13), (8, 16)]  # (p, m), m < p tried separately


def torch_table(name, p, m, v=None):
    """torch's per-rank compute actions ("0F3"), idle slots and gradient reductions left out."""
    ops = get_schedule_ops(name, p, m, v)
    return [[str(a) for a in rank if a is not None and "REDUCE" not in str(a)] for rank in ops]


def strs(actions):
    return [str(a) for a in actions]


@pytest.mark.parametrize("p, m", SIZES)
def test_gpipe_equals_torchs_table(p, m):
    assert [strs(gpipe(r, p, m)) for r in range(p)] == torch_table("GPipe", p, m)


@pytest.mark.parametrize("p, m", SIZES)
def test_1f1b_equals_torchs_table(p, m):
    table = torch_table("1F1B", p, m)
    for r in range(p - 1):
        assert strs(one_f_one_b(r, p, m)) == table[r], f"rank {r}"
    # torch 2.13's table (Schedule1F1B._get_pipeline_order) numbers the last rank's forwards
    # 1..m instead of 0..m-1 (its runtime runs 0..m-1: test_pipeline.py records it). Compare the
    # F/B pattern there, and the numbers wherever torch's table is self-consistent.
    ours, theirs = strs(one_f_one_b(p - 1, p, m)), table[p - 1]
    assert [a[1] for a in ours] == [a[1] for a in theirs]
    if sorted(theirs) == sorted(ours):
        assert ours == theirs


@pytest.mark.parametrize("p, m", [(2, 2), (2, 6), (4, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_1f1b_equals_torchs_table(p, m, v):
    expected = torch_table("Interleaved1F1B", p, m, v)
    assert [strs(interleaved_1f1b(r, p, m, v)) for r in range(p)] == expected


def all_schedules(p, m):
    yield "naive", 1, {r: SCHEDULES["naive"](r, p, 1) for r in range(p)}, 1
    for name in ("GPipe", "1F1B", "ZB-H1"):
        yield name, m, {r: SCHEDULES[name](r, p, m) for r in range(p)}, 1
    if m % p == 0:
        for v in (2, 3):
            yield "interleaved 1F1B", m, {r: interleaved_1f1b(r, p, m, v) for r in range(p)}, v


@pytest.mark.parametrize("p, m", SIZES + [(4, 2), (4, 3), (8, 3)])
def test_every_schedule_runs_each_pass_once_in_order(p, m):
    for name, mm, acts, v in all_schedules(p, m):
        for r, actions in acts.items():
            kinds = "FBW" if name == "ZB-H1" else "FB"
            expected = {(s, k, i) for s in range(r, p * v, p) for k in kinds for i in range(mm)}
            assert sorted(actions) == sorted(expected), (name, r)
            where = {tuple(a): n for n, a in enumerate(actions)}
            for s, _, i in expected:  # F before B before W of one micro-batch
                order = [where[s, k, i] for k in kinds]
                assert order == sorted(order), (name, r, s, i)
        simulate(acts)  # raises if the ranks would wait for each other forever


@pytest.mark.parametrize("p, m", SIZES + [(4, 2), (8, 3)])
def test_simulated_bubble_is_the_formula(p, m):
    for name, mm, acts, v in all_schedules(p, m):
        if name == "ZB-H1" and m < p:
            continue  # Qi et al.'s (p-1)(F+B-W) needs m >= p: fewer W's cannot fill the cool-down
        expected = bubble_formula(name, p, mm, v)
        assert bubble_fraction(simulate(acts)) == pytest.approx(expected), name


def busy_per_rank(spans):
    busy = {}
    for s in spans:
        busy[s.rank] = busy.get(s.rank, 0) + s.duration
    return busy


@pytest.mark.parametrize("p, m", [(2, 2), (2, 6), (4, 4), (4, 8), (4, 12), (8, 16)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_chunks_take_one_vth_of_a_stage(p, m, v):
    """Narayanan et al. 2021 §2.2.2: a chunk is 1/v of a stage, so a rank's work over the step
    is 1F1B's (m (F + B)), and the idle time, not only its share, is 1F1B's divided by v."""
    inter = simulate({r: interleaved_1f1b(r, p, m, v) for r in range(p)})
    one = simulate({r: one_f_one_b(r, p, m) for r in range(p)})
    work = m * (UNIT_TIMES["F"] + UNIT_TIMES["B"])
    assert busy_per_rank(inter) == pytest.approx(dict.fromkeys(range(p), work))
    assert busy_per_rank(one) == pytest.approx(dict.fromkeys(range(p), work))
    assert bubble_time(inter) == pytest.approx((p - 1) * 3 / v)  # (p-1)(F+B)/v, F = 1, B = 2
    assert bubble_time(inter) == pytest.approx(bubble_time_formula("interleaved 1F1B", p, v))
    assert bubble_time(one) == pytest.approx(bubble_time_formula("1F1B", p))
    assert bubble_time(inter) * v == pytest.approx(bubble_time(one))
    assert max(s.end for s in inter) < max(s.end for s in one)  # a shorter step, same work


@pytest.mark.parametrize("p, m", SIZES)
def test_bubble_time_follows_the_formulas(p, m):
    for name in ("GPipe", "1F1B", "ZB-H1"):
        if name == "ZB-H1" and m < p:
            continue
        spans = simulate({r: SCHEDULES[name](r, p, m) for r in range(p)})
        assert bubble_time(spans) == pytest.approx(bubble_time_formula(name, p)), name


def test_measured_stage_times_replace_the_units():
    """A last stage that takes twice as long (its head and loss) stretches the step: given each
    stage's own F and B, simulate predicts the imbalanced bubble; stage_times_of reads them back."""
    p, m = 2, 4
    acts = {r: one_f_one_b(r, p, m) for r in range(p)}
    times = {0: {"F": 1.0, "B": 2.0}, 1: {"F": 2.0, "B": 4.0}}
    spans = simulate(acts, stage_times=times)
    assert stage_times_of(spans) == times
    # the slow stage is busy m (F + B) = 24 and sets the pace; stage 0 waits for it
    step = max(s.end for s in spans)
    assert step == pytest.approx(1 + m * 6 + 2)  # 1 (stage 0 F0) + m x 6 + 2 (its B3)
    assert bubble_fraction(spans) > bubble_formula("1F1B", p, m)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_first_rank_peak_is_korthikantis_factor(p, v):
    """Rank 0 of interleaved 1F1B holds 2(p-1) + (v-1)p + 1 chunks of 1/v of a stage at its
    peak: p (1 + (p-1)/(p v)) stages' worth (Korthikanti et al. 2022) once m >= 2p; at m = p
    every forward runs before the first backward: p stages' worth."""
    for m in (p, 2 * p, 3 * p, 5 * p):
        chunks = in_flight_peak(interleaved_1f1b(0, p, m, v))
        assert chunks / v == pytest.approx(first_rank_peak_formula("interleaved 1F1B", p, m, v))
        if m >= 2 * p:
            assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
        else:
            assert chunks / v == p
    for m in (2, p, 2 * p):  # the other schedules' rank 0
        for name in ("GPipe", "1F1B", "ZB-H1"):
            assert in_flight_peak(SCHEDULES[name](0, p, m)) == first_rank_peak_formula(name, p, m)


@pytest.mark.parametrize("p, m", SIZES)
def test_zb_h1_bubble_is_a_third_of_1f1b(p, m):
    def idle(actions):  # idle units per rank over the step (F = B = W = 1, full backward 2)
        spans = simulate(actions)
        step = max(s.end for s in spans)
        return step * p - sum(s.duration for s in spans)
    one = idle({r: one_f_one_b(r, p, m) for r in range(p)})
    zb = idle({r: zb_h1(r, p, m) for r in range(p)})
    assert one == 3 * (p - 1) * p and zb == (p - 1) * p  # (p-1)(F+B+W) vs (p-1)(F+B-W), per rank


@pytest.mark.parametrize("p, m", SIZES + [(4, 2), (8, 3)])
def test_micro_batches_in_flight(p, m):
    for r in range(p):
        assert in_flight_peak(gpipe(r, p, m)) == m  # GPipe keeps all m until the backwards
        assert in_flight_peak(one_f_one_b(r, p, m)) == min(m, p - r)  # 1F1B: at most p - rank
        assert in_flight_peak(zb_h1(r, p, m)) == min(m, p)  # ZB-H1: never more than 1F1B's peak


def test_stage_boundaries_are_balanced_extra_blocks_first():
    assert stage_boundaries(8, 3) == [0, 3, 6, 8]
    for n in range(1, 13):
        for p in range(1, n + 1):
            bounds = stage_boundaries(n, p)
            sizes = [b - a for a, b in zip(bounds, bounds[1:])]
            assert bounds[0] == 0 and bounds[-1] == n and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)


def test_bad_input_says_what_to_do():
    with pytest.raises(ValueError, match="use fewer stages or more layers"):
        stage_boundaries(2, 4)
    with pytest.raises(ValueError, match="must be a multiple of 4"):
        interleaved_1f1b(0, 4, 6)
    with pytest.raises(ValueError, match="is not a pipeline rank"):
        gpipe(4, 4, 8)
    with pytest.raises(ValueError, match="n_micro must be a whole number"):
        one_f_one_b(0, 4, 0)
    with pytest.raises(ValueError, match="use gpipe"):
        SCHEDULES["naive"](0, 4, 8)
    with pytest.raises(RuntimeError, match="deadlocks"):  # both ranks wait for B first
        simulate({0: gpipe(0, 2, 1)[::-1], 1: gpipe(1, 2, 1)[::-1]})
