"""What an MoE layer of the course saves for backward, measured with lesson 01's
`SavedTensorLog` on lesson 09's own `MoE` (dlcourse/moe.py) in float32 and float64 on the CPU,
against the planner's count (`planner/moe_activations.py`) for the same config, tensor by
tensor and to the byte (issue 34). A fixed routing: the router reads the first E features of
the input, where each token's scores are set. The course layer keeps a few tensors Megatron-Core
need not (`course_extra_rows` says which and why); they are counted here by name, not hidden."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

from dlcourse.memory import SavedTensorLog
from dlcourse.models import Block, MoEConfig
from dlcourse.moe import MoE
from dlcourse.planner import moe_cost
from dlcourse.planner.layouts import Layout, Workload
from dlcourse.planner.moe_activations import course_extra_rows, moe_layer_rows
from dlcourse.planner.moe_spec import from_config

B = 2
DROPLESS = MoEConfig(vocab_size=64, seq_len=16, hidden=32, n_layers=2, n_heads=4, n_experts=8,
                     top_k=2)
CAPPED = MoEConfig(vocab_size=50, seq_len=12, hidden=24, n_layers=4, n_heads=2, n_experts=4,
                   top_k=1, moe_every=2, n_shared_experts=2, expert_hidden=40, bias=False,
                   tie_embeddings=False, capacity_factor=1.5)
DTYPES = {torch.float32: 4, torch.float64: 8}
# which module the log finds each of the planner's expert rows saved in
WHERE = {"experts' input (routed rows)": "experts.fc", "experts: GELU input": "experts",
         "experts: GELU output": "experts.proj", "shared experts: GELU input": "shared",
         "shared experts: GELU output": "shared.proj"}


def plan(config, e):
    """The planner's rows of the MoE part (the attention's and norms' are the dense planner's,
    tested in test_planner_activations.py) and the course's extras, {name: bytes}."""
    work = Workload(from_config(config), config.seq_len, B * config.seq_len, mlp="eager")
    L = Layout(1, 1, 1, micro_batch=B, micro_batches=1, ep=1)
    rows = [r for r in moe_layer_rows(work, L, e=e)
            if r[1] in ("expert input", "expert output", "activation input",
                        "activation output", "router")]
    return {name: nbytes for name, _, nbytes in rows + course_extra_rows(work, L, e)}


def routed_input(config, dtype, skewed):
    """x (B, T, h) whose router logits are its first E features: token n scores its choices
    k, k-1, ..., 1, the rest 0. Balanced: token n picks experts n, n+1, ... mod E (each expert
    k N / E rows); skewed: every token picks experts 0..k-1."""
    N, E, k = B * config.seq_len, config.n_experts, config.top_k
    x = torch.randn(N, config.hidden, dtype=dtype)
    x[:, :E] = 0
    for n in range(N):
        for j in range(k):
            x[n, (j if skewed else n + j) % E] = k - j
    return x.view(B, config.seq_len, config.hidden).requires_grad_()


def fixed_router(moe, config):
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :config.n_experts] = torch.eye(config.n_experts)


def saved(moe, x):
    """(records of new storages, live bytes) of one forward; backward then runs on them."""
    with SavedTensorLog(moe, ignore=[x]) as log:  # x: the MLP input, the attention's row
        out = moe(x)
    new = [r for r in log.records if r.new]
    held = log.live_bytes()["activations"]
    out.sum().backward()
    return new, held


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config,skewed", [(DROPLESS, False), (DROPLESS, True), (CAPPED, False)])
def test_the_course_moe_layer_saves_the_planners_rows_and_its_extras(config, skewed, dtype):
    """Every storage autograd keeps in lesson 09's MoE is one of the planner's rows or a named
    course extra, byte for byte; the big ones are found in the module the planner says."""
    torch.manual_seed(0)
    moe = MoE(config).to(dtype).train()
    fixed_router(moe, config)
    x = routed_input(config, dtype, skewed)
    records, held = saved(moe, x)
    N, k, E = B * config.seq_len, config.top_k, config.n_experts
    assert moe.dropped == 0 and int(moe.tokens_per_expert.sum()) == k * N
    if skewed:  # the imbalance at ep 1 changes which expert, not how many rows
        assert moe.tokens_per_expert[:k].tolist() == [N] * k
    else:
        assert moe.tokens_per_expert.tolist() == [k * N // E] * E
    rows = plan(config, DTYPES[dtype])
    assert Counter(r.nbytes for r in records) == Counter(rows.values())
    assert held == sum(rows.values())
    for name, where in WHERE.items():
        if name in rows:
            assert [r.nbytes for r in records if r.where == where] == [rows[name]], name
    assert rows["experts' input (routed rows)"] == k * N * config.hidden * DTYPES[dtype]


def test_the_planner_counts_a_capacity_as_an_upper_bound():
    """Skewed routing with a capacity: every token's one choice is expert 0, which keeps its
    `capacity`; the planner, not knowing the routing at ep 1, counts all k N rows."""
    torch.manual_seed(0)
    moe = MoE(CAPPED).to(torch.float64).train()
    fixed_router(moe, CAPPED)
    x = routed_input(CAPPED, torch.float64, skewed=True)
    records, _ = saved(moe, x)
    kept = int(moe.tokens_per_expert.sum())
    N = B * CAPPED.seq_len
    assert kept == 9 and moe.dropped == N - kept  # ceil(1.5 x 24 / 4)
    measured = [r.nbytes for r in records if r.where == "experts.fc"]
    assert measured == [kept * CAPPED.hidden * 8]
    assert plan(CAPPED, 8)["experts' input (routed rows)"] == \
        moe_cost.routed_rows(from_config(CAPPED), N) * CAPPED.hidden * 8 == N * CAPPED.hidden * 8


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", [DROPLESS, replace(CAPPED, capacity_factor=4.0)])
def test_an_moe_block_saves_the_planners_layer_and_the_course_extras(config, dtype):
    """A whole block of the course's MoE GPT (attention + MoE, its routing as the seeded
    weights make it; CAPPED's capacity raised to E x k N / E rows an expert, so that none is
    dropped whatever the routing): `moe_layer_rows` with torch's CPU masks and statistics in
    the values' dtype, plus the course's extras, less the causal mask (as the dense test)."""
    torch.manual_seed(0)
    block = Block(config)
    block.mlp = MoE(config)
    block = block.to(dtype).train()
    x = torch.randn(B, config.seq_len, config.hidden, dtype=dtype, requires_grad=True)
    with SavedTensorLog(block) as log:  # x counted: the dense planner's "norm 1 input"
        out = block(x)
    T = config.seq_len
    mask = sum(r.nbytes for r in log.records
               if r.new and r.dtype == torch.bool and r.shape == (T, T))
    held = log.live_bytes()["activations"] - mask
    out.sum().backward()
    assert block.mlp.dropped == 0
    e = DTYPES[dtype]
    work = Workload(from_config(config), T, B * T, attention="eager", mlp="eager")
    L = Layout(1, 1, 1, micro_batch=B, micro_batches=1, ep=1)
    layer = moe_layer_rows(work, L, e=e, mask_bytes=e, stat_bytes=e)
    expected = sum(b for *_, b in layer) + sum(b for *_, b in course_extra_rows(work, L, e))
    if not config.bias:  # the dense planner reads bias=False as RMSNorm (Llama), one statistic
        # a token; the course's LayerNorm(bias=False) keeps its mean and 1/std: one more each
        expected += 2 * B * T * e
    assert held == expected


@pytest.mark.parametrize("config", [DROPLESS, CAPPED])
def test_weights_in_the_activation_keep_one_fp32_value_a_row_not_the_output(config):
    """`Recipe.probs_in_activation` (Megatron-Core's experts): the planner's h-wide expert
    output, which the course's combine keeps (measured above), becomes one fp32 weight a
    routed row; nothing else changes."""
    from dlcourse.planner.moe_cost import Recipe
    work = Workload(from_config(config), config.seq_len, B * config.seq_len, mlp="eager")
    L = Layout(1, 1, 1, micro_batch=B, micro_batches=1, ep=1)
    course = {n: b for n, _, b in moe_layer_rows(work, L)}
    megatron = {n: b for n, _, b in moe_layer_rows(work, L, Recipe(probs_in_activation=True))}
    rows = config.top_k * B * config.seq_len
    output = "experts' output (routed rows, the combine's weights)"
    assert course.pop(output) == rows * config.hidden * 2
    assert megatron.pop("routed rows' weights (fp32)") == rows * 4
    assert course == megatron
