"""Lesson 10's divergence finder on the catalogue (dlcourse/debug/bugs.py): for every bug, the
finder names the place the bug's mechanism predicts, and the same run without the bug (the
correct strategy, the same config) matches the one-process reference everywhere.

All 2-rank cases run in one launch and the 4-rank ones in another (a module fixture each), so
the whole file costs two jobs. Float64 throughout (DebugConfig), so a correct strategy matches to
rounding (~1e-15) and the finder's 1e-9 threshold has no false alarms.
"""

from dataclasses import replace

import pytest

from dlcourse.debug import SUBJECTS, DebugConfig, find_divergence, find_divergences
from dlcourse.debug.bugs import CATALOGUE
from dlcourse.debug.compare import TOLERANCE
from dlcourse.debug.divergence import reference_subject
from dlcourse.debug.subjects import moe_model
from dlcourse.models import lm_loss

# bug -> (step, phase, name, ranks) the finder must report, and why it is that place.
# Backward finishes ln_f first: the output layer is tied to tok_emb, whose gradient is done last.
EXPECTED = {
    # ln_f is the first sequence-parallel LayerNorm that backward reaches (Megatron-LM #1446
    # saw it on final_layernorm); every rank holds only its own tokens' share of its gradient
    "sp_layernorm_grads": (1, "gradients", "ln_f.weight", [0, 1]),
    # rank 0 draws the reference's weights (seed + 0); tok_emb is the first parameter listed
    "dp_no_broadcast": (0, "parameters before step 1", "tok_emb.weight", [1]),
    # every gradient is 2x (or weighs the ranks 1:1 instead of 3:2): the first one finished
    "dp_grads_summed": (1, "gradients", "ln_f.weight", [0, 1]),
    "uneven_batch_unweighted": (1, "gradients", "ln_f.weight", [0, 1]),
    # biases start at zero (GPT-2's init), so step 1 is right; after it, block 0's attention
    # projection is the first row-parallel layer the forward meets
    "tp_row_bias_per_rank": (2, "activations", "blocks.0.attn.proj", [0, 1]),
    # the output layer is column-parallel over the vocabulary: its input gradient (ln_f's output
    # gradient) is the first one f must sum, so ln_f's own gradients are the first wrong ones
    "tp_f_backward_not_summed": (1, "gradients", "ln_f.weight", [0, 1]),
    # each shard is scaled by its own factor; the gathered gradient is wrong on every rank
    "zero_clip_local_norm": (1, "gradients", "ln_f.weight", [0, 1]),
    # every gradient is m = 2 times too large
    "pp_loss_not_divided": (1, "gradients", "ln_f.weight", [0, 1]),
    # only the tied matrix misses a term: the first stage's copy lacks the output layer's
    "pp_tied_embeddings_unsynced": (1, "gradients", "tok_emb.weight", [0, 1]),
    # the contiguous layout gives rank 0 tokens 0..s/2-1, whose local positions are the global
    # ones; rank 1's are shifted by s/2 (under zig-zag both ranks would be wrong)
    "cp_local_positions": (1, "activations", "pos_emb", [1]),
    # the dense gradients stay right; the last block's experts are the first expert parameters
    # backward finishes (its proj's bias and weight come from one node, the bias handed over first)
    "ep_experts_all_reduced": (1, "gradients", "blocks.1.mlp.experts.proj.bias", [0, 1]),
    # replicated gradients (LayerNorms) average equal tp copies and stay right; the first
    # tp-sharded one in backward order averages two different shards
    "dp_tp_world_group": (1, "gradients", "blocks.1.mlp.proj.weight", [0, 1, 2, 3]),
}
# TP + dropout: one process draws, by construction, the masks a correct tp = 2 run draws. Block
# 0's attention-probability dropout is the first dropout of the forward: shared there, neither
# rank's heads get their own stream's mask. The per-rank residual bug leaves it right (the heads
# still draw per rank) and shows in the next dropout, after the output projection's g: neither
# rank draws from the shared seed, so both hold a copy unlike one process's (and each other's)
EXPECTED.update({
    "tp_dropout_heads_shared": (1, "activations", "blocks.0.attn.attn_dropout", [0, 1]),
    "tp_dropout_resid_per_rank": (1, "activations", "blocks.0.attn.resid_dropout", [0, 1]),
})
# every correct row of `dlcourse tour` reporting nothing: tests/test_debug_tour.py
N_PARAMS = len(dict(DebugConfig().new_model().named_parameters()))  # 28 named tensors
N_MOE_PARAMS = len(dict(moe_model(DebugConfig()).named_parameters()))  # lesson 09's MoE GPT


def _cases(world_size):
    bugs = [b for b, bug in CATALOGUE.items() if SUBJECTS[bug.subject].world_size == world_size]
    # each bug's strategy and config without the bug: the control of its test
    controls = [(CATALOGUE[b].subject, None, replace(DebugConfig(), **CATALOGUE[b].config))
                for b in bugs]
    unique = list({repr(c): c for c in controls}.values())
    return [(CATALOGUE[b].subject, b, None) for b in bugs] + unique


def _run(world_size):
    cases = _cases(world_size)
    reports = find_divergences(cases)
    return {(name, bug, repr(cfg) if bug is None else None): r
            for (name, bug, cfg), r in zip(cases, reports)}


@pytest.fixture(scope="module")
def two_ranks():
    return _run(2)


@pytest.fixture(scope="module")
def four_ranks():
    return _run(4)


def _report(reports, bug):
    return reports[(CATALOGUE[bug].subject, bug, None)]


def _control(reports, bug):
    cfg = replace(DebugConfig(), **CATALOGUE[bug].config)
    return reports[(CATALOGUE[bug].subject, None, repr(cfg))]


def _check(reports, bug):
    control = _control(reports, bug)
    assert control.first is None, f"{bug}: the correct strategy diverges: {control}"
    n_params = N_MOE_PARAMS if "MoE" in CATALOGUE[bug].subject else N_PARAMS
    assert control.compared["gradients"] == n_params and control.compared["activations"] > 0
    first = _report(reports, bug).first
    assert first is not None, f"{bug}: the finder found nothing"
    assert (first.step, first.phase, first.name, first.ranks) == EXPECTED[bug], str(first)
    assert first.diff > 1e-9 * max(1.0, first.scale)


@pytest.mark.parametrize("bug", [b for b in EXPECTED
                                 if SUBJECTS[CATALOGUE[b].subject].world_size == 2])
def test_finder_names_the_first_divergence_at_two_ranks(two_ranks, bug):
    _check(two_ranks, bug)


def test_finder_names_the_wrong_axis_group_at_four_ranks(four_ranks):
    _check(four_ranks, "dp_tp_world_group")


def test_what_differs_after_the_first_place_follows_the_mechanism(two_ranks):
    """The report's spread: the tied-embedding bug leaves every step-1 tensor right but the tied
    matrix (its gradient, then its value); the row-bias bug leaves all of step 1 right."""
    tied = _report(two_ranks, "pp_tied_embeddings_unsynced").spread
    assert (tied.get((1, "activations"), 0), tied[(1, "gradients")],
            tied[(1, "parameters after the step")]) == (0, 1, 1)
    bias = _report(two_ranks, "tp_row_bias_per_rank").spread
    assert not any(step == 1 for step, _ in bias) and bias[(2, "activations")] > 0
    # one reduction missing: the step-1 gradients wrong are exactly the tensors it owes (lesson
    # 10's "how to read"). SP: every LayerNorm's weight and bias (2 per block and ln_f), the
    # position embedding, each block's two row-parallel biases; EP: the expert tensors
    n_layers = DebugConfig().model.n_layers
    sp_partial = 2 * (2 * n_layers + 1) + 1 + 2 * n_layers
    assert _report(two_ranks, "sp_layernorm_grads").spread[(1, "gradients")] == sp_partial
    experts = [n for n, _ in moe_model(DebugConfig()).named_parameters() if ".experts." in n]
    assert _report(two_ranks, "ep_experts_all_reduced").spread[(1, "gradients")] == len(experts)


def test_sync_every_micro_batch_shows_in_the_collective_count_not_in_the_values(two_ranks):
    bug = "dp_sync_every_micro_batch"
    report, control = _report(two_ranks, bug), _control(two_ranks, bug)
    assert report.first is None and control.first is None  # right, only slow
    # per step: 1 all-reduce for uneven_loss_scale's sample count, then one per bucket per sync;
    # m = 2 micro-batches syncing each instead of once doubles the buckets' all-reduces
    m = CATALOGUE[bug].config["micro_batches"]
    for bugged, correct in zip(report.comm, control.comm):
        assert bugged["all_reduce"] - 1 == m * (correct["all_reduce"] - 1)


def test_a_doubled_gradient_moves_adamw_only_where_some_gradient_is_small(two_ranks):
    """Lesson 10's count of the parameters that differ after step 1 when every gradient is twice
    the right one (summed over 2 ranks; undivided over 2 micro-batches). AdamW's first update is
    lr g / (|g| + eps) per element; doubling g moves it by lr eps |g| / ((|g| + eps)(2|g| + eps)),
    about lr eps / (2|g|): over the finder's threshold only in a tensor with some |g| below
    lr eps / (2 TOLERANCE). The reference's own first gradients predict how many that is."""
    cfg = DebugConfig()
    reference, _ = reference_subject(cfg, SUBJECTS["DP overlapped (lesson 03)"])
    model, (x, y) = reference.modules[0], cfg.data()
    lm_loss(model(x), y).backward()
    bound = cfg.lr * reference.optimizer.defaults["eps"] / (2 * TOLERANCE)
    sensitive = sum(p.grad.abs().min().item() < bound for p in model.parameters())
    assert 0 < sensitive < N_PARAMS  # the count tells something: some tensors are spared
    for bug in ("dp_grads_summed", "pp_loss_not_divided"):
        spread = _report(two_ranks, bug).spread
        assert spread[(1, "gradients")] == N_PARAMS  # every gradient is wrong ...
        assert spread[(1, "parameters after the step")] == sensitive, bug  # ... not every step


def test_every_bug_says_its_fix():
    missing = [name for name, bug in CATALOGUE.items() if not bug.fix.strip()]
    assert not missing, f"bugs without a fix line (the lesson prints it): {missing}"


def test_every_bug_has_a_test():
    assert set(EXPECTED) | {"dp_sync_every_micro_batch"} == set(CATALOGUE)
    assert len(CATALOGUE) >= 10


def test_unknown_names_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="unknown bug 'nope'"):
        find_divergence("TP (lesson 04)", bug="nope")
    with pytest.raises(ValueError, match="unknown strategy"):
        find_divergence("TP (lesson 99)")
