"""Lesson 07's checks (`dlcourse/checks/combining.py`, `combining_plan.py`, `combining_library.py`):
correct answers written other ways pass, the wrong answers students write fail with a message
naming the case and a hint that says which mistake it was (then the seed that repeats the cases),
and the library's answers (RankGrid, the planner, model_state_bytes, torch's DeviceMesh) are
refused however they are reached. Every run draws new cases, so each wrong answer here fails on
whatever is drawn; the answers right for one grid shape or one order fail because grids and
orders are drawn at random."""

import itertools
import math

import pytest
import torch
from checking import first_line_and_hint

from dlcourse.checks.combining import grid as combining
from dlcourse.checks.combining import (
    check_axis_groups,
    check_best_layout,
    check_cost_per_million_tokens,
    check_first_stage_activation_bytes,
    check_grid_state_bytes,
    check_rank_coords,
    check_step_collectives,
)
from dlcourse.memory import model_state_bytes
from dlcourse.parallel.grid import RankGrid
from dlcourse.planner.estimate import estimate

# --- exercise 1: rank_coords -----------------------------------------------------------------


def coords_divmod(rank, sizes, order):
    coords = {}
    for axis in reversed(order):
        rank, coords[axis] = divmod(rank, sizes[axis])
    return coords


def coords_strides(rank, sizes, order):  # strides, as torch's tensors lay out a C-ordered array
    strides = {axis: math.prod(sizes[a] for a in order[i + 1:]) for i, axis in enumerate(order)}
    return {axis: rank // strides[axis] % sizes[axis] for axis in order}


def coords_unravel(rank, sizes, order):  # a tensor of ranks, searched
    grid = torch.arange(math.prod(sizes.values())).reshape([sizes[a] for a in order])
    where = (grid == rank).nonzero()[0].tolist()
    return dict(zip(order, where))


def coords_reversed_order(rank, sizes, order):  # the first axis varies fastest
    return coords_divmod(rank, sizes, tuple(reversed(order)))


def coords_default_order(rank, sizes, order):  # ignores the order it is given
    return coords_divmod(rank, sizes, ("pp", "dp", "tp"))


def coords_fixed_shape(rank, sizes, order):  # right for a 2 x 2 x 2 grid in default order only
    return {"pp": rank // 4, "dp": rank // 2 % 2, "tp": rank % 2}


def coords_tuple(rank, sizes, order):  # (dp, pp, tp), not a dict
    c = coords_divmod(rank, sizes, order)
    return c["dp"], c["pp"], c["tp"]


def coords_from_rank_grid(rank, sizes, order):
    return RankGrid(**sizes, order=order).coords(rank)


GRID = RankGrid(dp=2, tp=2, pp=2)  # made before the check: its methods must refuse


def coords_from_an_instance(rank, sizes, order):  # a method of an instance made earlier
    return GRID.coords(rank)


def coords_device_mesh(rank, sizes, order):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", tuple(sizes[a] for a in order), mesh_dim_names=order)
    return dict(zip(order, mesh.get_coordinate()))


@pytest.mark.parametrize("answer", [coords_divmod, coords_strides, coords_unravel])
def test_rank_coords_passes_correct_answers(answer, capsys):
    check_rank_coords(answer)
    assert "rank_coords: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (coords_reversed_order, "expected", "varying fastest"),
    (coords_default_order, "expected", ""),
    (coords_fixed_shape, "", ""),
    (coords_tuple, "returned a tuple, expected a dict with the keys 'pp'", ""),
])
def test_rank_coords_fails_wrong_answers(answer, says, hint):
    first, got_hint = first_line_and_hint(check_rank_coords, answer)
    assert first.startswith("rank_coords("), first
    assert says in first and hint in got_hint, (first, got_hint)


@pytest.mark.parametrize("answer, refused", [
    (coords_from_rank_grid, "RankGrid"),
    (coords_from_an_instance, "RankGrid.coords"),
    (coords_device_mesh, "init_device_mesh"),
])
def test_rank_coords_refuses_the_library(answer, refused):
    first, _ = first_line_and_hint(check_rank_coords, answer)
    assert refused in first and "which this exercise does not allow" in first, first


def test_a_failure_names_the_seed_that_repeats_it():
    with pytest.raises(AssertionError) as failed:
        check_rank_coords(coords_reversed_order, seed=7)
    assert "check_rank_coords(your_function, seed=7)" in str(failed.value)
    with pytest.raises(AssertionError) as again:
        check_rank_coords(coords_reversed_order, seed=7)
    assert str(again.value) == str(failed.value)


# --- exercise 2: axis_groups -----------------------------------------------------------------

def groups_by_other_coords(sizes, order, axis):
    found = {}
    for rank in range(math.prod(sizes.values())):
        c = coords_divmod(rank, sizes, order)
        found.setdefault(tuple(c[a] for a in order if a != axis), []).append(rank)
    return list(found.values())


def groups_by_transpose(sizes, order, axis):  # move the axis last, read the rows
    grid = torch.arange(math.prod(sizes.values())).reshape([sizes[a] for a in order])
    rows = grid.movedim(order.index(axis), -1).reshape(-1, sizes[axis])
    return [sorted(row.tolist(), reverse=True) for row in reversed(rows)]  # any order passes


def groups_consecutive(sizes, order, axis):  # right for the innermost axis only: mixes axes
    n = math.prod(sizes.values())
    return [list(range(i, i + sizes[axis])) for i in range(0, n, sizes[axis])]


def groups_strided_by_size(sizes, order, axis):  # ranks sizes[axis] apart: mixes axes too
    n, k = math.prod(sizes.values()), sizes[axis]
    return [list(range(i, n, n // k)) for i in range(n // k)]


def groups_reversed_order(sizes, order, axis):
    return groups_by_other_coords(sizes, tuple(reversed(order)), axis)


def groups_from_rank_grid(sizes, order, axis):
    return RankGrid(**sizes, order=order).axis_groups(axis)


@pytest.mark.parametrize("answer", [groups_by_other_coords, groups_by_transpose])
def test_axis_groups_passes_correct_answers(answer, capsys):
    check_axis_groups(answer)
    assert "axis_groups: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer", [groups_consecutive, groups_strided_by_size,
                                    groups_reversed_order])
def test_axis_groups_fails_groups_that_mix_axes(answer):
    first, hint = first_line_and_hint(check_axis_groups, answer)
    assert first.startswith("axis_groups(") and "expected the" in first, first
    assert "other axis fixed" in hint or "holds sizes" in hint or "a group of" in hint, hint


def test_axis_groups_refuses_the_rank_grid():
    first, _ = first_line_and_hint(check_axis_groups, groups_from_rank_grid)
    assert "RankGrid" in first and "does not allow" in first, first


# --- exercise 3: step_collectives ------------------------------------------------------------

TABLE = {"pp": {"pipeline": ("send", "recv")},
         "dp": {"data": ("all_reduce",), "zero": ("reduce_scatter", "all_gather")},
         "tp": {"tensor": ("all_reduce",), "sp": ("all_gather", "reduce_scatter"),
                "last stage": ("all_gather",)}}


def collectives_by_table(dp, tp, pp, zero_stage, sequence_parallel):  # frozensets, a table
    used = {"pp": ["pipeline"] * (pp > 1),
            "dp": ([("zero" if zero_stage else "data")] if dp > 1 else []),
            "tp": (["tensor"] + ["sp"] * sequence_parallel + ["last stage"] * (pp > 1)
                   if tp > 1 else [])}
    return {axis: frozenset(op for s in kinds for op in TABLE[axis][s])
            for axis, kinds in used.items()}


def _rules(dp, tp, pp, zero_stage, sequence_parallel):
    out = {"pp": [], "dp": [], "tp": []}
    if pp > 1:
        out["pp"] += ["send", "recv"]
    if dp > 1:
        out["dp"] += ["reduce_scatter", "all_gather"] if zero_stage > 0 else ["all_reduce"]
    if tp > 1:
        out["tp"] += ["all_reduce"] + ["all_gather"] * (pp > 1 or sequence_parallel) \
            + ["reduce_scatter"] * sequence_parallel
    return out  # lists, with a name twice sometimes: the names are what counts


def collectives_zero_on_tp(dp, tp, pp, zero_stage, sequence_parallel):  # ZeRO's ops on tp
    out = {k: set(v) for k, v in _rules(dp, tp, pp, zero_stage, sequence_parallel).items()}
    if zero_stage and dp > 1 and tp > 1:
        out["tp"] |= {"reduce_scatter", "all_gather"}
        out["dp"] = {"all_reduce"}
    return out


def collectives_zero_all_reduce(dp, tp, pp, zero_stage, sequence_parallel):
    out = {k: set(v) for k, v in _rules(dp, tp, pp, zero_stage, sequence_parallel).items()}
    if dp > 1:
        out["dp"] = {"all_reduce"}
    return out


def collectives_size_one_talks(dp, tp, pp, zero_stage, sequence_parallel):
    return _rules(max(dp, 2), max(tp, 2), max(pp, 2), zero_stage, sequence_parallel)


def collectives_axes_swapped(dp, tp, pp, zero_stage, sequence_parallel):
    out = _rules(dp, tp, pp, zero_stage, sequence_parallel)
    return {"pp": out["pp"], "dp": out["tp"], "tp": out["dp"]}


@pytest.mark.parametrize("answer", [_rules, collectives_by_table])
def test_step_collectives_passes_correct_answers(answer, capsys):
    check_step_collectives(answer)
    assert "step_collectives: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (collectives_zero_on_tp, "ZeRO shards the model state over the data-parallel replicas"),
    (collectives_zero_all_reduce, "reduce-scatter"),
    (collectives_size_one_talks, "size 1"),
    (collectives_axes_swapped, ""),
])
def test_step_collectives_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_step_collectives, answer)
    assert first.startswith("step_collectives(") and "expected" in first, first
    assert hint in got_hint, got_hint


# --- exercise 4: grid_state_bytes ------------------------------------------------------------

def state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision):
    per = (2, 2, 12) if mixed_precision else (4, 4, 8)
    split = [dp if zero_stage >= s else 1 for s in (3, 2, 1)]  # params, grads, optimizer
    return sum(b * n_params / (tp * pp * d) for b, d in zip(per, split))


def state_bytes_k_form(n_params, dp, tp, pp, zero_stage, mixed_precision):  # ZeRO paper's form
    p, g, k = (2, 2, 12) if mixed_precision else (4, 4, 8)
    psi = n_params / tp / pp
    return {0: (p + g + k) * psi, 1: (p + g) * psi + k * psi / dp,
            2: p * psi + (g + k) * psi / dp, 3: (p + g + k) * psi / dp}[zero_stage]


def state_bytes_zero_on_tp(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, tp, tp, pp, zero_stage, mixed_precision)  # ZeRO's division: tp


def state_bytes_dp_tp_swapped(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, tp, dp, pp, zero_stage, mixed_precision)


def state_bytes_no_pp(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return state_bytes(n_params, dp, tp, 1, zero_stage, mixed_precision)


def state_bytes_world(n_params, dp, tp, pp, zero_stage, mixed_precision):  # all over N
    return state_bytes(n_params, 1, 1, 1, 0, mixed_precision) / (dp * tp * pp)


def state_bytes_library(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return model_state_bytes(n_params / (tp * pp), dp=dp, zero_stage=zero_stage).total


@pytest.mark.parametrize("answer", [state_bytes, state_bytes_k_form])
def test_grid_state_bytes_passes_correct_answers(answer, capsys):
    check_grid_state_bytes(answer)
    assert "grid_state_bytes: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (state_bytes_zero_on_tp, "divides by tp where ZeRO divides"),
    (state_bytes_no_pp, "divide by pp too"),
    (state_bytes_dp_tp_swapped, ""),
    (state_bytes_world, ""),
])
def test_grid_state_bytes_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_grid_state_bytes, answer)
    assert first.startswith("grid_state_bytes(") and "bytes per rank, expected" in first, first
    assert hint in got_hint, got_hint


def test_grid_state_bytes_refuses_model_state_bytes():
    first, _ = first_line_and_hint(check_grid_state_bytes, state_bytes_library)
    assert "model_state_bytes" in first and "does not allow" in first, first


# --- exercise 5: cost_per_million_tokens -----------------------------------------------------

def cost(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour):
    bubble = (n_stages - 1) / (n_micro + n_stages - 1)
    step = compute_time_s / (1 - bubble)
    return n_gpus * price_per_gpu_hour * step / 3600 / tokens_per_step * 1e6


def cost_via_throughput(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                        price_per_gpu_hour):
    step = compute_time_s * (1 + (n_stages - 1) / n_micro)  # Narayanan's (p - 1)/m of the ideal
    tokens_per_hour = tokens_per_step / step * 3600
    return n_gpus * price_per_gpu_hour / (tokens_per_hour / 1e6)


def cost_no_bubble(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                   price_per_gpu_hour):
    return n_gpus * price_per_gpu_hour * compute_time_s / 3600 / tokens_per_step * 1e6


def cost_bubble_of_compute(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                           price_per_gpu_hour):
    step = compute_time_s * (1 + (n_stages - 1) / (n_micro + n_stages - 1))
    return n_gpus * price_per_gpu_hour * step / 3600 / tokens_per_step * 1e6


def cost_per_token(*args):
    return cost(*args) / 1e6


def cost_hours_times(*args):
    return cost(*args) * 3600 ** 2


def cost_seconds_as_hours(*args):
    return cost(*args) * 3600


def cost_one_gpu(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour):
    return cost(compute_time_s, n_stages, n_micro, tokens_per_step, 1, price_per_gpu_hour)


def cost_from_the_planner(*args):
    estimate(None, None, None)


@pytest.mark.parametrize("answer", [cost, cost_via_throughput])
def test_cost_passes_correct_answers(answer, capsys):
    check_cost_per_million_tokens(answer)
    assert "cost_per_million_tokens: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (cost_no_bubble, "idle GPUs are paid for too"),
    (cost_bubble_of_compute, "share of the step, not of the compute"),
    (cost_per_token, "cost of one token"),
    (cost_hours_times, "divide the seconds by 3600"),
    (cost_seconds_as_hours, "divide the seconds by 3600"),
    (cost_one_gpu, ""),
])
def test_cost_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_cost_per_million_tokens, answer)
    assert first.startswith("cost_per_million_tokens(") and "expected $" in first, first
    assert hint in got_hint, got_hint


def test_cost_refuses_the_planner():
    first, _ = first_line_and_hint(check_cost_per_million_tokens, cost_from_the_planner)
    assert "estimate from dlcourse.planner.estimate" in first, first


# --- exercise 6: best_layout -----------------------------------------------------------------

def layout_cost(c, price, tokens):
    return cost(c["compute_time_s"], c["n_stages"], c["n_micro"], tokens, c["n_gpus"], price)


def best(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    key = lambda c: layout_cost(c, price_per_gpu_hour, tokens_per_step)
    return min(fits, key=key)["name"] if fits else None


def best_sorted_gpu_seconds(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    def gpu_seconds(c):  # the price and the tokens are the same for all: GPU-seconds decide
        return c["n_gpus"] * c["compute_time_s"] * (c["n_micro"] + c["n_stages"] - 1) / c["n_micro"]
    ranked = sorted(candidates, key=lambda c: (c["bytes_per_gpu"] > memory_budget, gpu_seconds(c)))
    return ranked[0]["name"] if ranked[0]["bytes_per_gpu"] <= memory_budget else None


def best_ignores_memory(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    key = lambda c: layout_cost(c, price_per_gpu_hour, tokens_per_step)
    return min(candidates, key=key)["name"]


def best_fastest(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    step = lambda c: c["compute_time_s"] * (c["n_micro"] + c["n_stages"] - 1) / c["n_micro"]
    return min(fits, key=step)["name"] if fits else None


def best_ignores_the_bubble(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fits = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    return min(fits, key=lambda c: c["n_gpus"] * c["compute_time_s"])["name"] if fits else None


def best_strict_budget(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    return best([c for c in candidates if c["bytes_per_gpu"] < memory_budget], memory_budget,
                price_per_gpu_hour, tokens_per_step)


def best_never_none(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    return best(candidates, memory_budget, price_per_gpu_hour, tokens_per_step) or \
        min(candidates, key=lambda c: c["bytes_per_gpu"])["name"]


@pytest.mark.parametrize("answer", [best, best_sorted_gpu_seconds])
def test_best_layout_passes_correct_answers(answer, capsys):
    check_best_layout(answer)
    assert "best_layout: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (best_ignores_memory, "does not fit cannot run"),
    (best_fastest, "fastest step, not the cheapest"),
    (best_ignores_the_bubble, "its pipeline idles"),
    (best_strict_budget, ""),
    (best_never_none, "return None"),
])
def test_best_layout_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_best_layout, answer)
    assert first.startswith("best_layout(") and "expected" in first, first
    assert hint in got_hint, got_hint


# --- exercise 7: first_stage_activation_bytes ------------------------------------------------

def first_stage_closed_form(layer_bytes, n_layers, p, m, v):
    chunk = n_layers // (p * v) * layer_bytes
    warmup = 2 * (p - 1) + (v - 1) * p if v > 1 else p - 1
    return min(warmup + 1, m * v) * chunk


def first_stage_simulated(layer_bytes, n_layers, p, m, v):
    """Written another way: play the first rank's warm-up and steady state, count the peak."""
    total = m * v
    warmup = min(total, p - 1 if v == 1 else 2 * (p - 1) + (v - 1) * p)
    held = peak = 0
    for k in range(total):  # forward k; after the warm-up each forward is followed by a backward
        held += 1
        peak = max(peak, held)
        if k >= warmup:
            held -= 1
    return peak * n_layers / (p * v) * layer_bytes


def first_stage_doubled(layer_bytes, n_layers, p, m, v):  # interleaving's factor at every v
    return p * (1 + (p - 1) / (p * v)) * n_layers / p * layer_bytes


def first_stage_whole_chunks(layer_bytes, n_layers, p, m, v):  # a chunk counted as a stage
    return first_stage_closed_form(layer_bytes, n_layers, p, m, v) * v


def first_stage_no_cap(layer_bytes, n_layers, p, m, v):  # m < p forgotten
    return first_stage_closed_form(layer_bytes, n_layers, p, max(m, p), v)


def first_stage_interleaving_saves(layer_bytes, n_layers, p, m, v):  # 1F1B's count for all v
    return min(m, p) * n_layers / p * layer_bytes


def first_stage_from_lesson_06(layer_bytes, n_layers, p, m, v):
    from dlcourse.parallel.pipeline.measure import in_flight_peak
    from dlcourse.parallel.pipeline.schedules import interleaved_1f1b
    return in_flight_peak(interleaved_1f1b(0, p, m, v)) * n_layers / (p * v) * layer_bytes


@pytest.mark.parametrize("answer", [first_stage_closed_form, first_stage_simulated])
def test_first_stage_passes_correct_answers(answer, capsys):
    check_first_stage_activation_bytes(answer)
    assert "first_stage_activation_bytes: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, hint", [
    (first_stage_doubled, "interleaving's factor (1 + (p - 1)/(p v)) at v = 1"),
    (first_stage_whole_chunks, "1/v of a stage's layers"),
    (first_stage_interleaving_saves, "it holds more, not less"),
    (first_stage_no_cap, ""),
])
def test_first_stage_fails_wrong_answers(answer, hint):
    first, got_hint = first_line_and_hint(check_first_stage_activation_bytes, answer)
    assert first.startswith("first_stage_activation_bytes(") and "expected" in first, first
    assert hint in got_hint, got_hint


def test_first_stage_refuses_lesson_06s_count():
    first, _ = first_line_and_hint(check_first_stage_activation_bytes, first_stage_from_lesson_06)
    assert "which this exercise does not allow" in first, first


# --- the references themselves ---------------------------------------------------------------

def test_the_grid_reference_agrees_with_the_lessons_rank_grid():
    """The check's enumeration (itertools.product) and lesson 07's RankGrid (divmod) are written
    independently; they must agree on every grid of up to 16 ranks and every order."""
    for sizes in itertools.product((1, 2, 3, 4), repeat=3):
        sizes = dict(zip(("pp", "dp", "tp"), sizes))
        if math.prod(sizes.values()) > 16:
            continue
        for order in itertools.permutations(("pp", "dp", "tp")):
            grid = RankGrid(**sizes, order=order)
            coords = combining.reference_coords(sizes, order)
            assert coords == [grid.coords(r) for r in range(grid.world_size)]
            for axis in ("pp", "dp", "tp"):
                assert combining.reference_groups(sizes, order, axis) == \
                    sorted(grid.axis_groups(axis))


# The step_collectives reference against what lesson 07's combine() issues, counted at torch's
# dispatcher (lesson 02's CommCounter) on 6 ranks: the two axes of each grid have different
# sizes (2 and 3), so a collective's group size says which axis it ran on.
MEASURED = {  # name: (dp, tp, pp, zero_stage, sequence_parallel, micro_batches)
    "DP x TP": (3, 2, 1, 0, False, 1), "ZeRO-1 x TP": (3, 2, 1, 1, False, 1),
    "ZeRO-3 x TP": (3, 2, 1, 3, False, 1), "ZeRO-2 x TP, SP": (3, 2, 1, 2, True, 1),
    "DP x PP": (2, 1, 3, 0, False, 3), "TP x PP": (1, 2, 3, 0, False, 3),
}


def _collectives_per_axis(plans):
    """On every rank: {name: {axis: set of ops}} of one training step of each plan."""
    from dlcourse.collectives import CommCounter
    from dlcourse.models import GPT, GPTConfig, synthetic_tokens
    from dlcourse.parallel.combine import GridPlan, combine
    config = GPTConfig(vocab_size=16, seq_len=4, n_layers=3, n_heads=2, hidden=8)
    x, y = synthetic_tokens(6, config, seed=1)
    out = {}
    for name, (dp, tp, pp, zero, sp, m) in plans.items():
        plan = GridPlan(RankGrid(dp=dp, tp=tp, pp=pp), zero_stage=zero, micro_batches=m,
                        sequence_parallel=sp, schedule="1F1B")
        trainer = combine(GPT(config, seed=0), plan, plan.grid.new_groups())
        with CommCounter() as comm:
            trainer.train_step(x, y)
        axis_of = {size: axis for axis, size in (("dp", dp), ("tp", tp), ("pp", pp)) if size > 1}
        out[name] = {axis: {r.op for r in comm.records if axis_of.get(r.group_size) == axis}
                     for axis in ("pp", "dp", "tp")}
    return out


def test_the_collectives_reference_is_what_combine_issues():
    import dlcourse
    per_rank = dlcourse.launch(_collectives_per_axis, MEASURED, world_size=6, timeout=120)
    for name, (dp, tp, pp, zero, sp, _) in MEASURED.items():
        measured = {axis: set().union(*(r[name][axis] for r in per_rank))
                    for axis in ("pp", "dp", "tp")}  # what the axis's groups ran, all ranks
        assert measured == combining.reference_collectives(dp, tp, pp, zero, sp), name


# --- issue 17: the determined student --------------------------------------------------------

def coords_default_argument(rank, sizes, order, _coords=RankGrid.coords):  # captured early
    return _coords(RankGrid(**sizes, order=order), rank)


def _copy(fn):
    import types
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)


_state_copy = _copy(model_state_bytes)  # a copy made before the check: another function object


def state_bytes_copied(n_params, dp, tp, pp, zero_stage, mixed_precision):
    return _state_copy(n_params / (tp * pp), dp=dp, zero_stage=zero_stage).total


def cost_from_another_module(*args):
    from dlcourse import planner  # the package's own name for it
    return planner.estimate.estimate(None, None, None)


@pytest.mark.parametrize("check, answer, refused", [
    (check_rank_coords, coords_default_argument, "RankGrid"),
    (check_grid_state_bytes, state_bytes_copied, "model_state_bytes"),
    (check_cost_per_million_tokens, cost_from_another_module, "estimate"),
])
def test_the_library_is_refused_however_it_is_reached(check, answer, refused):
    first, _ = first_line_and_hint(check, answer)
    assert refused in first and "which this exercise does not allow" in first, first


def test_a_table_of_one_runs_answers_fails_the_next_run():
    """Answers copied from one run (its seed) do not pass another: the cases are drawn afresh."""
    seen = {}

    def recording(*args):
        seen[repr(args)] = cost(*args)
        return seen[repr(args)]

    check_cost_per_million_tokens(recording, seed=1)

    def table(*args):
        return seen.get(repr(args), 0.0)

    check_cost_per_million_tokens(table, seed=1)  # the same cases: the table knows them
    first, _ = first_line_and_hint(check_cost_per_million_tokens, table, seed=2)
    assert "expected $" in first, first
