"""Dropout in lesson 04's TP GPT (`dlcourse/parallel/tensor/dropout.py`) and the one process it
must equal. The whole-model proof (the TP run equals `one_process_dropout` in float64, step by
step) is the finder's control in tests/test_debug_catalogue.py; here, each piece by itself:

- the one process's masks are the rule written out by hand with torch.manual_seed: head group r
  from Megatron's seed + 2718 + r, every residual mask from the seed itself; its draws leave the
  process's default stream where it was;
- on 2 real ranks, the correct table and the catalogue's two dropout bugs give the masks their
  names say: heads differ and residual copies agree (correct), heads agree (shared), residual
  copies differ (per rank);
- dropout under TP without a tracker, or with sequence parallelism, is refused.
"""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dlcourse
from dlcourse.debug.bugs import CATALOGUE
from dlcourse.models import GPT, GPTConfig
from dlcourse.parallel.tensor import check_tp, parallelize
from dlcourse.parallel.tensor.dropout import one_process_dropout
from dlcourse.parallel.tensor.rng import seed_tensor_parallel

CONFIG = GPTConfig(vocab_size=32, seq_len=8, n_layers=1, n_heads=2, hidden=16, dropout=0.25)
B, T, h, a = 4, CONFIG.seq_len, CONFIG.hidden, CONFIG.n_heads
SEED = 5


def _dropped(seed, shape, draws=2):
    """`draws` masks in a row from a stream seeded `seed`, as a rank draws one per step."""
    torch.manual_seed(seed)
    return [F.dropout(torch.ones(shape, dtype=torch.float64), CONFIG.dropout) for _ in range(draws)]


def test_one_process_masks_follow_the_rule_and_leave_the_default_stream():
    attn = one_process_dropout(GPT(CONFIG), tp=2, seed=SEED).blocks[0].attn
    torch.manual_seed(123)
    heads, resid = [], []
    for _ in range(2):  # two steps: each stream goes on where it stopped
        heads.append(attn.attn_dropout(torch.ones(B, a, T, T, dtype=torch.float64)))
        resid.append(attn.resid_dropout(torch.ones(B, T, h, dtype=torch.float64)))
    after = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(after, torch.rand(3))  # the default stream did not move
    for r in range(2):  # rank r's heads [r a/2, (r+1) a/2): Megatron's seed + 2718 + tp_rank
        want = _dropped(SEED + 2718 + r, (B, 1, T, T))
        assert all(torch.equal(got[:, r:r + 1], w) for got, w in zip(heads, want))
    assert all(torch.equal(got, w) for got, w in zip(resid, _dropped(SEED, (B, T, h))))
    assert (heads[0] == 0).any() and not torch.equal(heads[0][:, 0], heads[0][:, 1])


def masks_on_rank(bugs):
    """For each bug (None: the correct table): do block 0's heads masks and residual masks
    agree between the 2 ranks? Masks drawn on ones, as the modules draw them in a step."""
    group, out = dist.group.WORLD, {}
    for bug in bugs:
        with CATALOGUE[bug].patch() if bug else nullcontext():
            model = GPT(CONFIG)
            model = parallelize(model, group, tracker=seed_tensor_parallel(SEED, group))
        attn = model.blocks[0].attn
        masks = {"heads": attn.attn_dropout(torch.ones(B, a // 2, T, T)),
                 "residual": attn.resid_dropout(torch.ones(B, T, h))}
        for name, mask in masks.items():
            both = [torch.empty_like(mask) for _ in range(2)]
            dist.all_gather(both, mask, group=group)
            out[bug, name] = torch.equal(*both)
    return out


BUGS = [None, "tp_dropout_heads_shared", "tp_dropout_resid_per_rank"]


@pytest.fixture(scope="module")
def agree():
    return dlcourse.launch(masks_on_rank, BUGS, world_size=2, backend="gloo")[0]


@pytest.mark.parametrize("bug, heads, residual", [
    (None, False, True),  # each rank its own heads' mask; one residual tensor, one mask
    ("tp_dropout_heads_shared", True, True),  # every rank's heads get the same mask
    ("tp_dropout_resid_per_rank", False, False)])  # the replicated copies drop differently
def test_which_masks_agree_across_the_tp_ranks(agree, bug, heads, residual):
    assert (agree[bug, "heads"], agree[bug, "residual"]) == (heads, residual)


def test_dropout_without_a_tracker_or_with_sequence_parallel_is_refused():
    with pytest.raises(ValueError, match="needs a random-state tracker"):
        check_tp(CONFIG, 2)
    with pytest.raises(ValueError, match="with sequence parallelism is not built"):
        check_tp(CONFIG, 2, sequence_parallel=True, tracked=True)
    check_tp(CONFIG, 2, tracked=True)  # with a tracker: accepted
    check_tp(CONFIG, 1)  # one rank: plain dropout
