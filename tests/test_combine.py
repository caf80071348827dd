"""Lesson 07's proof (`dlcourse/parallel/combine.py`): the course GPT trained K AdamW steps on a
rank grid equals one process, for the 4-rank grids DP x TP, DP x PP, TP x PP, ZeRO-3 x TP (also
ZeRO-1 x TP, and ZeRO-2 x TP with sequence parallelism), DP x CP and CP x TP (lesson 08's
context parallelism as a fourth axis: zig-zag ring, Ulysses; with ZeRO sharded over the dp x cp
replicas too) and the 8-rank 2 x 2 x 2 grids
(dp x tp x pp in the default axis order and with tp outermost; dp x cp x tp with the ring);
sizes that cannot be cut are refused before any process starts.

One launch per world size: every 4-rank grid runs one after the other in the same job (each
builds its own groups), since a launch costs seconds on this machine.

Tolerance: float64 throughout. The grid adds the same numbers as one process in another order
(dp shards and micro-batches summed separately, tp partial sums all-reduced): ~1e-16 relative.
AdamW divides each update by sqrt(v) + eps, so an element whose exact gradient is (nearly) zero
can move by up to ~lr x rounding / eps; lessons 04 and 05 measured at most 3e-14 after 3 steps at
lr 1e-3; the grids here measured at most 2.6e-14 at lr 1e-2 (`pytest -s` prints it). We allow
1e-11, as lessons 04 and 05 do, far below a real mistake: the weights move by 3e-2, and skipping
the dp average (DP x TP), the tied embedding's gradient exchange (TP x PP) or the cp part of the
dp x cp average (averaging over groups.dp instead of groups.dp_cp, DP x CP and CP x TP) ends
6e-2 away, as does ZeRO x CP when ZeRO's broadcast of rank 0's buffers hands every cp rank
rank 0's token positions (lesson 08's positions were a buffer once: 5.9e-2), all measured.
"""

import functools

import pytest
import torch

import dlcourse
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.grid import RankGrid

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16)  # tied embeddings
BATCH, STEPS, LR, TOL = 8, 3, 1e-2, 1e-11
GRIDS_4 = {
    "DP x TP": GridPlan(RankGrid(dp=2, tp=2)),
    "DP x PP": GridPlan(RankGrid(dp=2, pp=2), micro_batches=2),
    "TP x PP": GridPlan(RankGrid(tp=2, pp=2), micro_batches=4, schedule="GPipe"),
    "ZeRO-3 x TP": GridPlan(RankGrid(dp=2, tp=2), zero_stage=3),
    "ZeRO-1 x TP": GridPlan(RankGrid(dp=2, tp=2), zero_stage=1),  # whole parameters kept
    "ZeRO-2 x TP with SP": GridPlan(RankGrid(dp=2, tp=2), zero_stage=2, sequence_parallel=True),
    # lesson 08's context parallelism as the fourth axis: gradients averaged over dp x cp
    "DP x CP": GridPlan(RankGrid(dp=2, cp=2)),  # the zig-zag ring
    "CP x TP": GridPlan(RankGrid(cp=2, tp=2)),  # the ring on each tp rank's a/tp heads
    "CP x TP, Ulysses": GridPlan(RankGrid(cp=2, tp=2), cp_method="ulysses"),  # a/(tp cp) heads
    "ZeRO-3 x CP": GridPlan(RankGrid(dp=2, cp=2), zero_stage=3),  # sharded over dp x cp = 4
    "ZeRO-2 x CP x TP": GridPlan(RankGrid(cp=2, tp=2), zero_stage=2),
}
GRIDS_8 = {  # the default order (tp innermost) and tp outermost: other ranks in each group
    "DP x TP x PP": GridPlan(RankGrid(dp=2, tp=2, pp=2), micro_batches=2),
    "DP x TP x PP, tp outermost": GridPlan(RankGrid(dp=2, tp=2, pp=2, order=("tp", "pp", "dp")),
                                           micro_batches=2, schedule="ZB-H1"),
    "DP x CP x TP": GridPlan(RankGrid(dp=2, cp=2, tp=2), cp_method="ring"),
}


def train_grids(plans):
    """On every rank: each plan's whole parameters and this rank's losses after STEPS steps."""
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    out = {}
    for name, plan in plans.items():
        trainer = combine(GPT(CFG, seed=0).double(), plan, plan.grid.new_groups(), lr=LR)
        losses = [trainer.train_step(x, y) for _ in range(STEPS)]
        out[name] = trainer.full_parameters(), losses
    return out


@functools.cache
def reference():
    """One process, the whole batch: {name: parameter} after STEPS steps, and the losses."""
    model = GPT(CFG, seed=0).double()
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {n: p.detach() for n, p in model.named_parameters()}, losses


def check_equal_to_one_process(results, name):
    want, want_losses = reference()
    start = dict(GPT(CFG, seed=0).double().named_parameters())
    moved = max((want[n] - start[n]).abs().max().item() for n in want)
    assert moved > 1e6 * TOL, f"the reference barely trained ({moved:.1e}): nothing is proven"
    worst = 0.0
    for rank, per_grid in enumerate(results):
        got, _ = per_grid[name]
        assert got.keys() == want.keys(), f"{name}, rank {rank}: names differ"
        for n in want:
            error = (got[n] - want[n]).abs().max().item()
            assert error <= TOL, f"{name}, rank {rank}: {n} off by {error:.1e} (moved {moved:.1e})"
            worst = max(worst, error)
    # each rank that reports a loss has its dp shard's mean; the dp shards are equal in size,
    # and every replica has as many reporting ranks, so their mean is the whole batch's loss
    for step, want_loss in enumerate(want_losses):
        reported = [per_grid[name][1][step] for per_grid in results
                    if per_grid[name][1][step] is not None]
        assert abs(sum(reported) / len(reported) - want_loss) <= TOL, f"{name}, step {step} loss"
    print(f"{name}: worst parameter error {worst:.1e}, weights moved {moved:.1e}")


@functools.cache
def four_rank_results():
    for plan in GRIDS_4.values():
        plan.check(CFG, BATCH)
    return dlcourse.launch(train_grids, GRIDS_4, world_size=4, backend="gloo", timeout=120)


@pytest.mark.parametrize("name", list(GRIDS_4))
def test_four_rank_grid_trains_like_one_process(name):
    check_equal_to_one_process(four_rank_results(), name)


def test_the_2x2x2_grid_on_eight_ranks_trains_like_one_process():
    for plan in GRIDS_8.values():
        plan.check(CFG, BATCH)
    results = dlcourse.launch(train_grids, GRIDS_8, world_size=8, backend="gloo", timeout=120)
    for name in GRIDS_8:
        check_equal_to_one_process(results, name)


@pytest.mark.parametrize("make, says", [
    (lambda: GridPlan(RankGrid(dp=2, tp=3)).check(CFG, BATCH),
     r"tp 3 does not divide n_heads 4 \(4 / 3 = 1.33333\)"),
    (lambda: GridPlan(RankGrid(pp=4), micro_batches=4).check(CFG, BATCH),
     "pp 4 is more stages than the model's 2 layers"),
    (lambda: GridPlan(RankGrid(pp=2, dp=2), micro_batches=1).check(CFG, BATCH),
     "1 micro-batches cannot keep 2 stages busy"),
    (lambda: GridPlan(RankGrid(dp=2, pp=2), micro_batches=2).check(CFG, 6),
     r"a batch of 6 sequences does not split into dp 2 x 2 micro-batches \(6 / 4 = 1.5\)"),
    (lambda: GridPlan(RankGrid(dp=2, pp=2), zero_stage=3, micro_batches=2),
     "ZeRO stage 3 with pp 2 is not built here"),
    (lambda: GridPlan(RankGrid(dp=4), zero_stage=4), "got 4"),
    (lambda: GridPlan(RankGrid(tp=4), sequence_parallel=True).check(GPTConfig(
        vocab_size=32, seq_len=6, n_heads=4, hidden=16), BATCH),
     r"tp 4 does not divide seq_len 6 \(6 / 4 = 1.5\)"),
    (lambda: GridPlan(RankGrid(tp=2, pp=2), micro_batches=2, sequence_parallel=True),
     "sequence_parallel with pp > 1 is not built here"),
    (lambda: GridPlan(RankGrid(pp=2), schedule="interleaved 1F1B", micro_batches=2),
     "GridPlan.schedule must be one of"),
    (lambda: GridPlan(RankGrid(cp=2, pp=2), micro_batches=2), "cp 2 with pp 2 is not built here"),
    (lambda: GridPlan(RankGrid(cp=2, tp=2), sequence_parallel=True),
     "cp 2 with sequence_parallel is not built here"),
    (lambda: GridPlan(RankGrid(cp=2), cp_method="striped"), "cp_method must be one of"),
    (lambda: GridPlan(RankGrid(cp=3)).check(CFG, BATCH),
     r"6 chunks \(cp 3\) do not divide the sequence of 8 tokens"),
    (lambda: GridPlan(RankGrid(cp=4, tp=2), cp_method="ulysses").check(CFG, BATCH),
     r"cp 4 does not divide n_heads 2 \(2 / 4 = 0.5\)"),  # each tp rank's 4 / 2 heads
])
def test_sizes_the_grid_cannot_cut_are_refused_before_any_process_starts(make, says):
    with pytest.raises(ValueError, match=says):
        make()


def test_cp_rules_apply_only_with_cp():
    """An odd sequence and dropout are refused by cp's layouts and kernels, not by grids without cp."""
    odd = GPTConfig(vocab_size=32, seq_len=7, n_heads=4, hidden=16, dropout=0.1)
    GridPlan(RankGrid(dp=4)).check(odd, BATCH)
    with pytest.raises(ValueError, match="4 chunks \\(cp 2\\) do not divide the sequence of 7"):
        GridPlan(RankGrid(dp=2, cp=2)).check(odd, BATCH)


def course_gpt_spec():
    """CFG as the planner's `ModelSpec`."""
    from dlcourse.memory.calculator import ModelSpec
    return ModelSpec("course GPT", CFG.n_layers, CFG.hidden, CFG.n_heads, CFG.vocab_size,
                     CFG.seq_len, ffn=4 * CFG.hidden, kv_heads=CFG.n_heads, gated_mlp=False,
                     bias=CFG.bias, tied=CFG.tie_embeddings, learned_positions=True)


def course_gpt_plans(world_size):
    """{layout: GridPlan} of every layout the planner ranks for CFG's BATCH on `world_size`
    ranks, with the course runtime's rules (where="dlcourse"), the recommended one first."""
    from dlcourse.planner.hardware import Cluster, gpu
    from dlcourse.planner.layouts import Workload
    from dlcourse.planner.rank import plan

    work = Workload(course_gpt_spec(), CFG.seq_len, BATCH * CFG.seq_len)
    found = plan(work, Cluster(gpu("h100"), world_size), where="dlcourse")
    ranked = [found.recommended] + [e for e in found.ranked if e is not found.recommended]
    return {e.layout.describe(): e.layout.grid_plan() for e in ranked}


@pytest.mark.parametrize("world_size", [4, 8])
def test_every_layout_the_planner_ranks_for_the_course_gpt_trains_like_one_process(world_size):
    """The planner's answer at course scale: its recommendation and every other layout it ranks
    (none breaks the runtime's rule book) build with `combine` and train equal to one process."""
    plans = course_gpt_plans(world_size)
    assert len(plans) >= 3, plans  # dp, pp and tp layouts at least: something to prove
    for plan in plans.values():
        plan.check(CFG, BATCH)
    results = dlcourse.launch(train_grids, plans, world_size=world_size, backend="gloo",
                              timeout=300)
    for name in plans:
        check_equal_to_one_process(results, name)


@pytest.mark.parametrize("layout_args", [
    dict(dp=1, tp=3, pp=1, micro_batch=8),  # tp 3 does not divide the 4 heads
    dict(dp=1, tp=1, pp=4, micro_batches=8),  # 4 stages, 2 layers
    dict(dp=2, tp=1, pp=2, micro_batches=1, micro_batch=4),  # 1 micro-batch, 2 stages
    dict(dp=1, tp=1, pp=2, cp=2, micro_batches=8),  # cp with pp: not built here
    dict(dp=2, tp=1, pp=2, zero_stage=1, micro_batches=4),  # ZeRO with pp: not built here
    dict(dp=1, tp=1, pp=2, interleave=2, micro_batches=8),  # v 2 of 2 layers on 2 stages
    dict(dp=1, tp=2, pp=2, micro_batches=8, sequence_parallel=True),  # SP with pp
])
def test_the_runtime_and_the_planner_refuse_a_grid_in_the_same_sentence(layout_args):
    """One rule book: the sentence `GridPlan` raises is among the planner's `problems` for the
    same layout of the same model."""
    from dlcourse.planner.hardware import Cluster, gpu
    from dlcourse.planner.layouts import Layout, Workload, problems

    layout = Layout(**layout_args)
    work = Workload(course_gpt_spec(), CFG.seq_len, BATCH * CFG.seq_len)
    with pytest.raises(ValueError) as refused:
        layout.grid_plan().check(CFG, BATCH)
    found = problems(layout, work, Cluster(gpu("h100"), layout.n_gpus), where="dlcourse")
    assert str(refused.value) in found, (str(refused.value), found)
