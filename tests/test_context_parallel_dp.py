"""Context parallelism beside data parallelism (lesson 08): the course GPT on 4 gloo ranks as a
dp 2 x cp 2 grid, cp innermost (torchtitan orders its mesh dp_shard before cp; the CP ranks,
which exchange K/V every layer, are then the neighbours), trained K AdamW steps, equals one
process on the whole batch, for every context-parallel method.

Each dp replica takes half the sequences; each cp rank of it s/cp tokens of each (zig-zag
chunks for the zig-zag ring). All four hold as many tokens, so the mean of their losses is the
whole batch's; the gradients are averaged over the cp group, then over the dp group (the same
`average_gradients`, another group), which is one average over the dp x cp replicas, as lesson
07's `combine` takes it (`groups.dp_cp`). The groups are lesson 07's `RankGrid(dp=2, cp=2)`'s,
whose default order puts cp inside dp.

Tolerance: float64, as `test_context_parallel_gpt.py` (the same sums in another order, ~1e-16
relative, magnified by AdamW for near-zero gradient elements); measured at most 3e-15. We allow
1e-11. Forgetting the dp average leaves each replica on its own half batch: off by 6e-3, measured.
"""

import pytest
import torch

import dlcourse
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.context import METHODS, average_gradients, context_parallel, cp_layout
from dlcourse.parallel.grid import RankGrid

CFG = GPTConfig(vocab_size=32, seq_len=16, n_layers=2, n_heads=4, hidden=16)
BATCH, STEPS, LR, TOL = 4, 3, 1e-3, 1e-11
DP, CP = 2, 2


def train(model, data, groups=()):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        lm_loss(model(data[0]), data[1]).backward()
        for group in groups:  # cp first, then dp: an average of equal-sized averages
            average_gradients(model, group)
        optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def dp_cp_errors():
    """{(method, averaged over dp?): max |dp x cp - one process| over every weight}."""
    torch.set_default_dtype(torch.float64)
    grid = RankGrid(dp=DP, cp=CP).new_groups()  # cp innermost: ranks 0, 1 share a sequence
    dp_rank, cp_rank = grid.coords["dp"], grid.coords["cp"]
    cp_group, dp_group = grid.cp, grid.dp
    data = synthetic_tokens(BATCH, CFG, seed=1)
    reference = train(GPT(CFG, seed=0), data)
    rows = slice(dp_rank * BATCH // DP, (dp_rank + 1) * BATCH // DP)  # this replica's sequences
    out = {}
    for method in METHODS:
        layout = cp_layout(CFG, cp_group, method)
        mine = [layout.shard(t[rows], cp_rank) for t in data]  # (B/dp, s/cp) each
        for with_dp in (True, False):
            groups = (cp_group, dp_group) if with_dp else (cp_group,)
            got = train(context_parallel(GPT(CFG, seed=0), cp_group, method), mine, groups)
            out[method, with_dp] = max((got[n] - reference[n]).abs().max().item()
                                       for n in reference)
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(dp_cp_errors, world_size=DP * CP, backend="gloo")


@pytest.mark.parametrize("method", list(METHODS))
def test_dp_by_cp_trains_the_gpt_as_one_process(results, method):
    for rank, out in enumerate(results):
        assert out[method, True] <= TOL, f"rank {rank}, {method}: off by {out[method, True]:.1e}"


def test_forgetting_the_dp_average_would_be_caught(results):
    assert min(out[method, False] for out in results for method in METHODS) > 1e3 * TOL
