"""Selective checkpointing by op (torchtitan's policy, `dlcourse/planner/op_checkpoint.py`): what
a course-GPT block keeps and what its backward recomputes, derived in the module and measured
here with torch's own `create_selective_checkpoint_contexts` on the course GPT (float64, no
biases so that Linear runs aten.mm as Llama's does). Exact: bytes are counted, not timed."""

import pytest
import torch

from dlcourse.memory.recompute import step_flops
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.planner.op_checkpoint import (checkpoint_blocks_by_op, course_block_kept_values,
                                            course_block_recomputed_flops, measure_kept)

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=4, n_heads=4, hidden=16, bias=False)
BATCH = 3


def _model():
    return GPT(CFG, seed=0).double()


@pytest.mark.parametrize("every", [1, 2])
def test_each_checkpointed_block_keeps_what_the_policy_says_to_the_byte(every):
    model = _model()
    caches = checkpoint_blocks_by_op(model, layer_frequency=every)
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    loss = lm_loss(model(x), y)
    blocks = CFG.n_layers // every
    assert len(caches) == blocks
    inputs = BATCH * CFG.seq_len * CFG.hidden  # the checkpoint's own, kept outside the cache
    want = blocks * (course_block_kept_values(CFG, BATCH) - inputs) * 8  # float64
    assert measure_kept(caches) == want
    loss.backward()  # the cached outputs are used, and the gradients exist
    assert all(p.grad is not None for p in model.parameters())


def test_the_backward_recomputes_every_other_matmul_and_nothing_else():
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    plain = step_flops(_model(), x, y, lm_loss)
    model = _model()
    checkpoint_blocks_by_op(model)
    by_op = step_flops(model, x, y, lm_loss)
    assert by_op["forward"] == plain["forward"]
    extra = by_op["backward"] - plain["backward"]
    assert extra == CFG.n_layers * course_block_recomputed_flops(CFG, BATCH)


def test_gradients_equal_the_plain_model():
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    plain, model = _model(), _model()
    checkpoint_blocks_by_op(model)
    for m in (plain, model):
        lm_loss(m(x), y).backward()
    ours = dict(model.named_parameters())
    for name, p in plain.named_parameters():
        mine = ours[name.replace("blocks.0.", "blocks.0.block.").replace(
            "blocks.1.", "blocks.1.block.").replace("blocks.2.", "blocks.2.block.").replace(
            "blocks.3.", "blocks.3.block.")]
        assert torch.equal(mine.grad, p.grad), name


def test_the_planner_counts_the_same_rows_for_the_course_gpt():
    """The planner's "op" rows (`activations.py`, any ModelSpec) for the course GPT, eager
    attention, 8-byte values: the bytes measured above, input included; and its recomputed
    FLOPs a token, the same 10 h^2 a token as measured."""
    from dlcourse.memory.calculator import ModelSpec
    from dlcourse.planner.activations import layer_activation_bytes
    from dlcourse.planner.timing import hardware_flops_per_token
    spec = ModelSpec("course GPT", CFG.n_layers, CFG.hidden, CFG.n_heads, CFG.vocab_size,
                     CFG.seq_len, ffn=4 * CFG.hidden, kv_heads=CFG.n_heads, gated_mlp=False,
                     bias=False, tied=True, learned_positions=True)
    rows = layer_activation_bytes(spec, CFG.seq_len, BATCH, recompute="op", attention="eager",
                                  bytes_per_value=8)
    assert rows == course_block_kept_values(CFG, BATCH) * 8
    extra = (hardware_flops_per_token(spec, CFG.seq_len, "op", "eager")
             - hardware_flops_per_token(spec, CFG.seq_len, "none", "eager"))
    tokens = BATCH * CFG.seq_len
    assert extra * tokens == CFG.n_layers * course_block_recomputed_flops(CFG, BATCH)
