"""Lesson 06's checks (`dlcourse/checks/pipeline.py`): the solutions and answers written another
way pass; the wrong answers students write fail with a message that names the case, the rank and
the step, and a hint that says which mistake it was; the answers of the course's pipeline package
and of torch's schedules are refused however they are reached. Every check draws its cases at
random, so each test runs on other cases every time, as a student's notebook does."""

import inspect
import itertools
import sys
import types
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.distributed.pipelining.schedules as torch_schedules

from checking import HANG_TIMEOUT_S, first_line_and_hint, starts
from dlcourse.checks.pipeline import schedules, stages
from dlcourse.checks.core.answers import class_methods
from dlcourse.checks.core import CheckFailed, ForbiddenCall
from dlcourse.checks.pipeline import (check_bubble_fraction, check_exchange,
                                      check_last_stage_backward, check_schedule_1f1b,
                                      check_stage_boundaries)

# --- exercise 1: stage boundaries ----------------------------------------------------------


def boundaries(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    out = [0]
    for s in range(n_stages):
        out.append(out[-1] + base + (s < extra))
    return out


def boundaries_dealt(n_layers, n_stages):  # blocks dealt out one by one, then counted
    held = [0] * n_stages
    for block in range(n_layers):
        held[block % n_stages] += 1
    return [0, *itertools.accumulate(held)]


def boundaries_rest_on_the_last(n_layers, n_stages):
    base = n_layers // n_stages
    return [base * s for s in range(n_stages)] + [n_layers]


def boundaries_middle_first(n_layers, n_stages):  # Llama 3: the ends lighter, extras inside
    base, extra = divmod(n_layers, n_stages)
    order = list(range(1, n_stages - 1)) + [0]  # middle stages, then the first; never the last
    sizes = [base + (s in order[:extra]) for s in range(n_stages)]
    return [0, *itertools.accumulate(sizes)]


def boundaries_spread(n_layers, n_stages):  # balanced, but the last stage gets an extra block
    return [s * n_layers // n_stages for s in range(n_stages + 1)]


def boundaries_extra_last(n_layers, n_stages):  # balanced, the extra blocks on the last stages
    return [n_layers - b for b in boundaries(n_layers, n_stages)][::-1]


def boundaries_for_four_stages(n_layers, n_stages):
    base, extra = divmod(n_layers, 4)
    return [0, *itertools.accumulate(base + (s < extra) for s in range(4))]


def sizes_not_boundaries(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    return [base + (s < extra) for s in range(n_stages)]


@pytest.mark.parametrize("answer", [boundaries, boundaries_dealt, boundaries_middle_first])
def test_stage_boundaries_pass(answer, capsys):
    check_stage_boundaries(answer)
    assert "stage_boundaries: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (boundaries_rest_on_the_last, "stage_boundaries(n_layers=", "n_layers % n_stages"),
    (boundaries_spread, "stage_boundaries(n_layers=", "output layer and the loss"),
    (boundaries_extra_last, "stage_boundaries(n_layers=", "output layer and the loss"),
    (boundaries_for_four_stages, "stage_boundaries(n_layers=", "boundaries"),
    (sizes_not_boundaries, "stage_boundaries(n_layers=", "running sums"),
])
def test_stage_boundaries_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_stage_boundaries, answer)
    assert starts(first, says) and hint in got_hint, (first, got_hint)


def test_a_failure_prints_the_seed_and_the_seed_draws_the_same_cases():
    with pytest.raises(CheckFailed) as failed:
        check_stage_boundaries(boundaries_spread)
    seed = int(str(failed.value).rsplit("seed ", 1)[1].split(":")[0])
    with pytest.raises(CheckFailed) as again:
        check_stage_boundaries(boundaries_spread, seed=seed)
    assert str(again.value) == str(failed.value)


# --- exercise 4: the 1F1B action list, run -------------------------------------------------


def schedule_1f1b(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank - 1, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def schedule_1f1b_simulated(rank, n_stages, n_micro):
    """Every stage, one tick at a time: a backward when its gradient has arrived, else a forward
    when its input has and fewer than p - r micro-batches are in flight."""
    p, m = n_stages, n_micro
    forwarded, backwarded = [0] * p, [0] * p
    orders = [[] for _ in range(p)]
    while min(backwarded) < m:
        ran = []
        for r in range(p):
            i, j = backwarded[r], forwarded[r]
            if i < j and (r == p - 1 or backwarded[r + 1] > i):
                ran.append((r, "B", i))
            elif j < m and j - i < p - r and (r == 0 or forwarded[r - 1] > j):
                ran.append((r, "F", j))
        for r, kind, i in ran:  # this tick's results arrive at the next tick
            orders[r].append([kind, i])  # lists, not tuples: also accepted
            (forwarded if kind == "F" else backwarded)[r] += 1
    return orders[rank]


def warm_up_p_minus_rank(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_not_capped(rank, n_stages, n_micro):  # right while n_micro >= p - rank - 1
    warm_up = n_stages - rank - 1
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def backward_first_in_steady_state(rank, n_stages, n_micro):
    warm_up = min(n_stages - rank - 1, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("B", i), ("F", warm_up + i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_of_rank(rank, n_stages, n_micro):  # the stages the wrong way round: waits forever
    warm_up = min(rank, n_micro)
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def warm_up_for_four_stages(rank, n_stages, n_micro):
    warm_up = max(0, min(3 - rank, n_micro))
    actions = [("F", i) for i in range(warm_up)]
    for i in range(n_micro - warm_up):
        actions += [("F", warm_up + i), ("B", i)]
    return actions + [("B", i) for i in range(n_micro - warm_up, n_micro)]


def gpipe(rank, n_stages, n_micro):
    return [("F", i) for i in range(n_micro)] + [("B", i) for i in range(n_micro)]


def triples(rank, n_stages, n_micro):  # (stage, kind, i) as the lesson's Action prints
    return [(rank, kind, i) for kind, i in schedule_1f1b(rank, n_stages, n_micro)]


def course_library(rank, n_stages, n_micro):
    from dlcourse.parallel.pipeline import schedules
    return [(a.kind, a.mb) for a in schedules.one_f_one_b(rank, n_stages, n_micro)]


def torch_schedule(rank, n_stages, n_micro):
    torch_schedules.get_schedule_class("1F1B")
    return schedule_1f1b(rank, n_stages, n_micro)


def torch_schedule_captured(rank, n_stages, n_micro, _get=torch_schedules.get_schedule_class):
    _get("1F1B")  # bound when the cell ran, before the check: still refused
    return schedule_1f1b(rank, n_stages, n_micro)


def test_the_reference_1f1b_is_the_tick_simulation():
    for p in range(1, 7):
        for m in range(1, 15):
            for rank in range(p):
                assert schedules.one_f_one_b(rank, p, m) == \
                    [tuple(a) for a in schedule_1f1b_simulated(rank, p, m)]


@pytest.mark.parametrize("answer", [schedule_1f1b, schedule_1f1b_simulated])
def test_schedule_1f1b_passes(answer, capsys):
    check_schedule_1f1b(answer)
    assert "schedule_1f1b: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (warm_up_p_minus_rank, "rank ? holds", "the warm-up is p - rank - 1"),
    (gpipe, "rank ? holds", "the warm-up is p - rank - 1"),
    (warm_up_not_capped, "rank 0 runs actions[", "min(p - rank - 1, n_micro) forwards"),
    (backward_first_in_steady_state, "rank ? runs actions[", "a forward (the newest), then"),
    (warm_up_of_rank, "rank ? waits forever (deadlock): rank 0 at actions[", "follow 1F1B"),
    (warm_up_for_four_stages, "rank ?", ""),
    (triples, "rank 0 returned a list of items like (0, 'F', 0), expected a list of", ""),
    (course_library, "rank ? called one_f_one_b from dlcourse.parallel.pipeline.schedules", ""),
    (torch_schedule, "rank ? called get_schedule_class from torch.distributed.pipelining.schedules", ""),
    (torch_schedule_captured, "rank ? called get_schedule_class from torch.distributed", ""),
])
def test_schedule_1f1b_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_schedule_1f1b, answer)
    assert first.startswith("schedule_1f1b with n_stages = "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)


def test_a_backward_before_its_forward_is_named_by_its_step():
    first, _ = first_line_and_hint(check_schedule_1f1b, backward_first_in_steady_state)
    # the last rank's warm-up is empty: its first action is the backward of micro-batch 0
    assert "actions[0] = ('B', 0), the backward of micro-batch 0, before its forward" in first


# --- exercise 5: the bubble ----------------------------------------------------------------


def bubble_fraction(n_stages, n_micro):
    return (n_stages - 1) / (n_micro + n_stages - 1)


def bubble_fraction_busy_first(n_stages, n_micro):  # 1 - busy share, as an exact fraction
    return 1 - Fraction(n_micro, n_micro + n_stages - 1)


def bubble_over_compute(n_stages, n_micro):
    return (n_stages - 1) / n_micro


def bubble_for_four_stages(n_stages, n_micro):
    return 3 / (n_micro + 3)


def busy_share(n_stages, n_micro):
    return n_micro / (n_micro + n_stages - 1)


def bubble_from_the_library(n_stages, n_micro):
    from dlcourse.parallel.pipeline import measure
    return measure.bubble_formula("1F1B", n_stages, n_micro)


@pytest.mark.parametrize("answer", [bubble_fraction, bubble_fraction_busy_first])
def test_bubble_fraction_passes(answer, capsys):
    check_bubble_fraction(answer)
    assert "bubble_fraction: passed" in capsys.readouterr().out


def test_the_course_librarys_answers_are_refused():
    from dlcourse.parallel.pipeline.stages import stage_boundaries as library_boundaries

    copy = types.FunctionType(library_boundaries.__code__, library_boundaries.__globals__)
    for check, answer, refused in [
            (check_stage_boundaries, lambda n, p: copy(n, p),  # a copy made before the check
             "stage_boundaries from dlcourse.parallel.pipeline.stages"),
            (check_bubble_fraction, bubble_from_the_library,
             "bubble_formula from dlcourse.parallel.pipeline.measure"),
            (check_stage_boundaries, lambda n, p, _captured=library_boundaries: _captured(n, p),
             "stage_boundaries from dlcourse.parallel.pipeline.stages")]:
        first, _ = first_line_and_hint(check, answer)
        assert f"called {refused}, which this exercise does not allow" in first, first


@pytest.mark.parametrize("answer, hint", [
    (bubble_over_compute, "idle time over the busy time"),
    (bubble_for_four_stages, "idle / (idle + busy)"),
    (busy_share, "busy share"),
])
def test_bubble_fraction_wrong_answers_fail(answer, hint):
    first, got_hint = first_line_and_hint(check_bubble_fraction, answer)
    assert starts(first, "bubble_fraction(n_stages=") and "the simulated timeline" in first
    assert hint in got_hint, got_hint


# --- exercise 2: the exchange --------------------------------------------------------------


def exchange(tensor, peer, group):
    received = torch.empty_like(tensor)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, group),
                                    dist.P2POp(dist.irecv, received, peer, group)])
    for work in works:
        work.wait()
    return received


def exchange_isend_recv(tensor, peer, group):
    received = torch.empty_like(tensor)
    sending = dist.isend(tensor, peer, group)
    dist.recv(received, peer, group)
    sending.wait()
    return received


def exchange_lower_rank_sends_first(tensor, peer, group):
    received = torch.empty_like(tensor)
    if dist.get_rank(group) < peer:
        dist.send(tensor, peer, group)
        dist.recv(received, peer, group)
    else:
        dist.recv(received, peer, group)
        dist.send(tensor, peer, group)
    return received


def exchange_both_send_first(tensor, peer, group):
    received = torch.empty_like(tensor)
    dist.send(tensor, peer, group)
    dist.recv(received, peer, group)
    return received


def exchange_into_the_input(tensor, peer, group):
    sending = dist.isend(tensor.clone(), peer, group)
    dist.recv(tensor, peer, group)  # overwrites the caller's activation
    sending.wait()
    return tensor


def exchange_returns_its_own(tensor, peer, group):
    received = torch.empty_like(tensor)
    sending = dist.isend(tensor, peer, group)
    dist.recv(received, peer, group)
    sending.wait()
    return tensor


def exchange_for_two_ranks(tensor, peer, group):  # the other rank is 1 - rank
    return exchange_isend_recv(tensor, 1 - dist.get_rank(group), group)


def exchange_by_all_gather(tensor, peer, group):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor, group)
    return gathered[peer]


@pytest.mark.parametrize("answer", [exchange, exchange_isend_recv,
                                    exchange_lower_rank_sends_first])
def test_exchange_passes(answer, capsys):
    check_exchange(answer)
    assert "exchange: passed" in capsys.readouterr().out


def test_both_neighbours_sending_first_is_a_deadlock_named_within_seconds():
    first, hint = first_line_and_hint(check_exchange, exchange_both_send_first,
                                      timeout=HANG_TIMEOUT_S)
    assert first.startswith("exchange on 2 ranks") and f"within {HANG_TIMEOUT_S} s" in first
    assert "both neighbours send first" in hint


def test_an_exchange_right_only_on_two_ranks_fails_on_more():
    # 5 s, not the default 10: the 2-rank case (well under 1 s) must finish on a loaded machine
    # too; then a case with more ranks hangs, and waits the whole timeout
    first, _ = first_line_and_hint(check_exchange, exchange_for_two_ranks, timeout=5)
    assert first.startswith("exchange on ") and not first.startswith("exchange on 2 "), first


@pytest.mark.parametrize("answer, says, hint", [
    (exchange_into_the_input, "rank ? changed the tensor it sent", "torch.empty_like"),
    (exchange_returns_its_own, "rank ? got wrong values from the exchange with rank", "empty_like"),
    (exchange_by_all_gather, "rank ? called dist.all_gather, which this exercise does not allow",
     ""),
])
def test_exchange_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_exchange, answer)
    assert first.startswith("exchange on "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)


# --- exercise 3: the loss scaled over micro-batches -----------------------------------------


def last_stage_backward(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    (loss_fn(stage(x), target) / n_micro).backward()
    return x.grad


def last_stage_backward_new_leaf(stage, x, target, loss_fn, n_micro):
    x = x.detach().requires_grad_()
    output = stage(x)
    # the output's gradient scaled instead of the loss: the same chain rule
    grad = torch.autograd.grad(loss_fn(output, target), output)[0] * (1.0 / n_micro)
    output.backward(grad)
    return x.grad


def loss_not_divided(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    loss_fn(stage(x), target).backward()
    return x.grad


def parameters_scaled_after_backward(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    before = [p.grad.clone() if p.grad is not None else 0 for p in stage.parameters()]
    loss_fn(stage(x), target).backward()
    with torch.no_grad():
        for p, old in zip(stage.parameters(), before):  # only this micro-batch's part, scaled
            p.grad.copy_(old + (p.grad - old) / n_micro)
    return x.grad  # unscaled: the earlier stages get n_micro times theirs


def divided_by_the_micro_batch_size(stage, x, target, loss_fn, n_micro):
    x.requires_grad_()
    (loss_fn(stage(x), target) / len(x)).backward()
    return x.grad


def zero_grad_each_micro_batch(stage, x, target, loss_fn, n_micro):
    stage.zero_grad()
    return last_stage_backward(stage, x, target, loss_fn, n_micro)


def no_requires_grad(stage, x, target, loss_fn, n_micro):
    (loss_fn(stage(x), target) / n_micro).backward()
    return x.grad


@pytest.mark.parametrize("answer", [last_stage_backward, last_stage_backward_new_leaf])
def test_last_stage_backward_passes(answer, capsys):
    check_last_stage_backward(answer)
    assert "last_stage_backward: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (loss_not_divided, "rank ? layer", "times the whole batch's: each micro-batch's loss"),
    (parameters_scaled_after_backward, "rank ? layer", "so that x.grad, which goes back"),
    (divided_by_the_micro_batch_size, "rank ? layer", "n_micro"),  # "n_micro times" if b = 1
    (zero_grad_each_micro_batch, "rank ? layer", "requires_grad_"),
    (no_requires_grad, "rank ? ", "requires_grad_"),
])
def test_last_stage_backward_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_last_stage_backward, answer)
    assert first.startswith("last_stage_backward on "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)


# --- refusing the answers ------------------------------------------------------------------

LIBRARY_SOURCE = '''
def bubble_fraction(n_stages, n_micro):
    return (n_stages - 1) / (n_micro + n_stages - 1)


class Schedule:
    def __init__(self, n_stages):
        self.n_stages = n_stages

    def bubble(self, n_micro):
        return (self.n_stages - 1) / (n_micro + self.n_stages - 1)
'''


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A pipeline package with a module added after the check module was imported: the checks
    walk the package when they run, so its answers are refused too."""
    package = tmp_path / "late_pipeline"
    (package / "schedules").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "schedules" / "__init__.py").write_text("")
    (package / "schedules" / "bubble.py").write_text(LIBRARY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(stages.PIPELINE, "packages", ("late_pipeline",))
    import late_pipeline.schedules.bubble as module
    yield module
    for name in [n for n in sys.modules if n.startswith("late_pipeline")]:
        del sys.modules[name]


def test_the_library_answer_is_refused_through_any_path(library):
    captured = library.bubble_fraction

    def by_module(n_stages, n_micro):
        return library.bubble_fraction(n_stages, n_micro)

    def by_default_argument(n_stages, n_micro, _answer=captured):
        return _answer(n_stages, n_micro)

    def by_class(n_stages, n_micro):
        return library.Schedule(n_stages).bubble(n_micro)

    schedule = library.Schedule(3)

    def by_instance_made_before(n_stages, n_micro):
        return schedule.bubble(n_micro)

    home = "from late_pipeline.schedules.bubble"
    for answer, refused in [(by_module, f"bubble_fraction {home}"),
                            (by_default_argument, f"bubble_fraction {home}"),
                            (by_class, f"Schedule {home}"),
                            (by_instance_made_before, f"Schedule.bubble {home}")]:
        first, _ = first_line_and_hint(check_bubble_fraction, answer)
        assert f"{refused}, which this exercise does not allow" in first, first
    assert captured(3, 5) == 2 / 7 and schedule.bubble(5) == 2 / 7  # given back afterwards


def test_every_answer_found_is_refused_while_the_guard_is_active_and_only_then():
    found = stages.PIPELINE.objects()
    answers = [(each, fn) for name, value in found
               for each, fn in ([(name, value)] if inspect.isfunction(value)
                                else class_methods(name, value))
               if not fn.__closure__]
    answers += [key for key in stages.PIPELINE.keys() if not key[1].__closure__]
    assert any("one_f_one_b from dlcourse.checks" in name for name, _ in answers)
    assert any("Schedule1F1B" in name for name, _ in answers)
    codes = [fn.__code__ for _, fn in answers]
    with stages.PIPELINE.refusing():
        for name, fn in answers:
            with pytest.raises(ForbiddenCall, match=f"called {name}, which this exercise does"):
                fn()
    assert [fn.__code__ for _, fn in answers] == codes
    assert torch_schedules.get_schedule_class("1F1B") is torch_schedules.Schedule1F1B


# --- an answer that replays one run's cases ------------------------------------------------


def test_a_table_of_one_runs_answers_fails_on_the_next_run():
    """A student who records the grader's cases and returns a table passes only the run it
    recorded: the next run draws other cases (all 6 inside the table: about 1 in 10^6)."""
    table = {}

    def recording(n_stages, n_micro):
        table[n_stages, n_micro] = bubble_fraction(n_stages, n_micro)
        return table[n_stages, n_micro]

    def replay(n_stages, n_micro):
        return table.get((n_stages, n_micro), 0.5)

    check_bubble_fraction(recording, seed=1)
    check_bubble_fraction(replay, seed=1)  # the recorded run
    with pytest.raises(CheckFailed, match="returned 0.5"):
        check_bubble_fraction(replay)
