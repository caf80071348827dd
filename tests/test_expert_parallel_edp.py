"""Expert parallelism inside data parallelism on real gloo ranks (lesson 09, Step 3;
`dlcourse/parallel/expert/groups.py`): 4 ranks, each training on 1 of 4 sequences (dp = 4),
experts dealt out over EP groups of 2 ({0, 1}, {2, 3}). Each expert then has 2 copies, one per
EP group, held by an expert-data-parallel group ({0, 2}, {1, 3}). Two AdamW steps in float64,
dropless top-2, top-1 with a capacity, and DeepSeek's shared + fine-grained experts with sigmoid
scores and ST-MoE's z-loss, equal one process on the whole batch: losses, the
first step's gradients, every weight after the steps. Without the EDP all-reduce the expert
gradients are each EP group's half only: asserted to be far off, so the test can fail.

Tolerance as tests/test_expert_parallel.py: float64 sums in another order, ~1e-16 relative;
AdamW's 1/(sqrt(v) + eps) can lift that on a near-zero gradient element to ~lr x noise / eps:
1e-11 on weights, 1e-12 on gradients and losses.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.models import MoEConfig, MoEGPT, moe_loss, synthetic_tokens
from dlcourse.moe import fine_grained
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.expert import (average_gradients, ep_layout, expert_parallel,
                                      full_parameters, new_expert_groups)

BASE = dict(vocab_size=32, seq_len=8, n_heads=4, hidden=16, n_experts=8, n_layers=2)
CONFIGS = {"dropless": MoEConfig(**BASE, top_k=2),
           "capacity": MoEConfig(**BASE, top_k=1, moe_every=2, capacity_factor=0.75),
           # DeepSeek's choices (moe.py): 16 experts of width 32, top-2, 2 shared ones, sigmoid
           # scores, and ST-MoE's z-loss: the shared experts are dense weights here
           "deepseek": fine_grained(MoEConfig(**BASE, top_k=1, n_shared_experts=1,
                                              score_func="sigmoid", z_loss_coef=1e-3), 2)}
BATCH, STEPS, LR, EP = 4, 2, 1e-3, 2
TOL_WEIGHTS, TOL = 1e-11, 1e-12


def train_both(config, edp_on, ep_group, edp_group):
    world = dist.group.WORLD
    data = synthetic_tokens(BATCH, config, seed=1)
    reference = MoEGPT(config, seed=3)
    model = expert_parallel(reference, ep_group, batch_group=world)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=LR)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    x, y = shard_batch(data, world)  # (1, s): this rank's sequence of the 4
    out = {"loss": [], "dropped": 0}
    for step in range(STEPS):
        opt_ref.zero_grad(), opt.zero_grad()
        want = moe_loss(reference, reference(data[0]), data[1])
        got = moe_loss(model, model(x), y)
        want.backward(), got.backward()
        average_gradients(model, ep_group, world, edp_group if edp_on else None)
        if step == 0:
            out["grads"] = ({n: p.grad.clone() for n, p in reference.named_parameters()},
                            full_parameters(model, ep_group, grads=True))
        opt_ref.step(), opt.step()
        mean = torch.tensor([got.item()])
        dist.all_reduce(mean)
        out["loss"].append((want.item(), mean.item() / dist.get_world_size()))
        out["dropped"] += sum(m.dropped for m in reference.moe_layers())
    out["weights"] = (dict(reference.named_parameters()), full_parameters(model, ep_group))
    out["edp ranks"] = dist.get_process_group_ranks(edp_group)
    return out


def worst(pair, experts):
    want, got = pair
    return max((want[n] - got[n]).abs().max().item() for n in want
               if (".experts." in n) == experts)


def on_four_ranks():
    torch.set_default_dtype(torch.float64)
    ep_group, edp_group = new_expert_groups(EP)
    return {(name, edp): train_both(CONFIGS[name], edp, ep_group, edp_group)
            for name in CONFIGS for edp in (True, False)}


@pytest.fixture(scope="module")
def runs():
    ranks = dlcourse.launch(on_four_ranks, world_size=4)
    return {key: [r[key] for r in ranks] for key in ranks[0]}


def test_layout_is_ep_innermost_and_refuses_what_does_not_divide():
    assert ep_layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert ep_layout(8, 4)[1] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match=r"ep 3 does not divide the 4 data-parallel ranks"):
        ep_layout(4, 3)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ep_2_inside_dp_4_equals_one_process(runs, name):
    for rank, r in enumerate(runs[name, True]):
        assert r["edp ranks"] == [rank % EP, rank % EP + EP]
        assert max(abs(a - b) for a, b in r["loss"]) < TOL
        assert worst(r["grads"], experts=False) < TOL
        assert worst(r["grads"], experts=True) < TOL
        assert worst(r["weights"], experts=False) < TOL_WEIGHTS
        assert worst(r["weights"], experts=True) < TOL_WEIGHTS
    assert (runs[name, True][0]["dropped"] > 0) == (name == "capacity")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_without_the_edp_all_reduce_the_expert_gradients_are_wrong(runs, name):
    r = runs[name, False][0]
    assert worst(r["grads"], experts=False) < TOL  # the dense ones are still right
    assert worst(r["grads"], experts=True) > 1e-4
