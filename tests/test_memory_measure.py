"""Lesson 01's measurements: saved tensors, model state, a step's phases and timeline, the course
GPT's estimator, activation checkpointing and optimizer offload."""

import pytest
import torch
from conftest import needs_gpu

from dlcourse.memory import (OffloadAdamW, SavedTensorLog, checkpoint_blocks, count_params,
                             cuda_memory, estimate_gpt_step, gpt_saved_tensors,
                             measure_model_state, measure_step, offload_bytes, param_shapes,
                             step_flops)
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens

SMALL = dict(vocab_size=64, seq_len=16, n_layers=2, n_heads=2, hidden=32)


def _step(config, batch, device="cpu", autocast_dtype=None, seed=0):
    model = GPT(config, seed=seed).to(device)
    x, y = (t.to(device) for t in synthetic_tokens(batch, config, seed=seed + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return measure_step(model, x, y, lm_loss, optimizer, autocast_dtype=autocast_dtype)


def _assert_within(measured, estimated, rel):
    """Every part of every phase within `rel`; a part that is zero on one side is zero on both."""
    for phase, parts in estimated.items():
        for part, expected in parts.as_dict().items():
            got = getattr(measured[phase], part)
            assert got == pytest.approx(expected, rel=rel), f"{phase} {part}: measured {got}, " \
                                                            f"estimated {expected}"


# ---------------------------------------------------------------- saved tensors


def test_a_storage_saved_three_times_counts_once():
    x = torch.randn(8, requires_grad=True)
    with SavedTensorLog() as log:
        y = x.exp()  # exp saves its output y
        z = (y * y).sum()  # mul saves y twice more: three saves, one storage
    assert [r.new for r in log.records] == [True, False, False]
    assert log.live_bytes() == {"activations": 8 * 4, "weight_copies": 0}
    z.backward()  # backward releases its saved tensors, but y is still ours
    assert log.live_bytes()["activations"] == 8 * 4
    del y
    assert log.live_bytes()["activations"] == 0


def test_parameters_are_not_activations_but_autocast_copies_are_weight_copies():
    linear = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    with SavedTensorLog(linear) as log:
        out = linear(x)  # saves x (4, 16) and the weight (8, 16), which is the parameter itself
    assert log.live_bytes() == {"activations": 4 * 16 * 4, "weight_copies": 0}
    with SavedTensorLog(linear) as log, torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x)  # now both are bf16 copies: x's is an activation, the weight's is not
    assert log.live_bytes() == {"activations": 4 * 16 * 2, "weight_copies": 8 * 16 * 2}
    del out  # the graph, and with it everything it saved, goes with the output
    assert log.live_bytes() == {"activations": 0, "weight_copies": 0}
    assert {r.where for r in log.records} == {""}  # the Linear is the model itself


def test_records_name_the_module_that_saved_them():
    config = GPTConfig(**SMALL)
    model = GPT(config)
    x, _ = synthetic_tokens(2, config)
    with SavedTensorLog(model, ignore=[x]) as log:
        model(x)
    where = {r.where for r in log.records}
    assert {"blocks.0.attn.qkv", "blocks.1.mlp.fc", "lm_head", "pos_emb"} <= where
    assert "tok_emb" not in where  # its only saved tensor is x, the caller's batch


def test_model_state_counts_a_tied_weight_once():
    tied, untied = GPTConfig(**SMALL), GPTConfig(**SMALL, tie_embeddings=False)
    for config in (tied, untied):
        assert measure_model_state(GPT(config)).params == 4 * count_params(config)
    V, h = SMALL["vocab_size"], SMALL["hidden"]
    assert count_params(untied) - count_params(tied) == V * h


# ---------------------------------------------------------------- the estimator, within 2%


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_measured_step_matches_the_course_gpt_estimator(dropout, tie, autocast_dtype):
    config = GPTConfig(**SMALL, dropout=dropout, tie_embeddings=tie)
    step = _step(config, batch=3, autocast_dtype=autocast_dtype)
    estimated = estimate_gpt_step(config, 3, autocast_dtype=autocast_dtype)
    _assert_within(step.phases, estimated, rel=0.02)


def test_estimator_holds_for_an_odd_shape_without_biases():
    config = GPTConfig(vocab_size=37, seq_len=10, n_layers=3, n_heads=3, hidden=24, bias=False,
                       dropout=0.2)
    _assert_within(_step(config, batch=5).phases, estimate_gpt_step(config, 5), rel=0.02)


def test_timeline_rises_in_forward_and_falls_in_backward():
    config = GPTConfig(**SMALL, dropout=0.1)
    step = _step(config, batch=2)
    forward = [p.parts.activations for p in step.timeline if p.phase == "forward"]
    assert forward == sorted(forward) and forward[-1] == step.phases["forward"].activations
    backward = [p for p in step.timeline if p.phase == "backward"]
    assert backward[-1].parts.activations == 0 and backward[-1].parts.grads == 4 * count_params(config)
    assert [p.parts.optimizer for p in step.timeline if p.phase != "step"] == [0] * (len(step.timeline) - 1)
    assert step.peak.parts.total >= max(parts.total for parts in step.phases.values())


# ---------------------------------------------------------------- checkpointing and offload


def test_checkpointing_keeps_block_inputs_and_gives_the_same_gradients():
    config, batch = GPTConfig(**SMALL, dropout=0.0), 3
    x, y = synthetic_tokens(batch, config)
    plain, ckpt = GPT(config), checkpoint_blocks(GPT(config))
    plain_step = measure_step(plain, x, y, lm_loss, torch.optim.SGD(plain.parameters(), lr=0.1))
    ckpt_step = measure_step(ckpt, x, y, lm_loss, torch.optim.SGD(ckpt.parameters(), lr=0.1))
    assert ckpt_step.loss == plain_step.loss
    for p, q in zip(plain.parameters(), ckpt.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)  # same update: same gradients
    # What is left: everything outside the blocks, plus each block's fp32 input (B, T, h).
    outside = sum(r.nbytes for r in gpt_saved_tensors(config, batch) if r.where != "block")
    block_inputs = config.n_layers * batch * config.seq_len * config.hidden * 4
    assert ckpt_step.phases["forward"].activations == outside + block_inputs


def test_recompute_costs_one_more_forward_of_every_block_but_its_last_matmul():
    config, batch = GPTConfig(**SMALL), 2
    x, y = synthetic_tokens(batch, config)
    plain = step_flops(GPT(config), x, y, lm_loss)
    ckpt = step_flops(checkpoint_blocks(GPT(config)), x, y, lm_loss)
    B, T, h, L = batch, config.seq_len, config.hidden, config.n_layers
    # One block's matmuls: qkv, proj, fc, proj = 12h² multiply-adds per token; q·k and p·v
    # each T·h per token. 2 FLOPs per multiply-add.
    block_forward = 2 * B * T * 12 * h * h + 2 * 2 * B * T * T * h
    # The recomputation stops once it has rebuilt every tensor backward needs: the MLP's output
    # projection (4h -> h) produces none of them, so it is not run again.
    last_matmul = 2 * B * T * 4 * h * h
    assert ckpt["forward"] == plain["forward"]
    assert ckpt["backward"] - plain["backward"] == L * (block_forward - last_matmul)


def test_offloaded_adamw_trains_exactly_like_adamw_and_counts_its_traffic():
    config = GPTConfig(**SMALL)
    x, y = synthetic_tokens(4, config)
    reference, offloaded = GPT(config), GPT(config)
    adamw = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    offload = OffloadAdamW(offloaded.parameters(), lr=1e-2)
    steps = 3
    for _ in range(steps):
        for model, optimizer in ((reference, adamw), (offloaded, offload)):
            optimizer.zero_grad()
            lm_loss(model(x), y).backward()
            optimizer.step()
    for p, q in zip(reference.parameters(), offloaded.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    formula = offload_bytes(count_params(config), mixed_precision=False)
    assert offload.bytes_to_host + offload.bytes_to_device == steps * formula["per_step"]
    assert measure_model_state(offloaded, None) == formula["device"]  # nothing else on device
    host = offload.host_bytes()
    assert (host.params, host.grads) == (formula["host"].params, formula["host"].grads)
    assert host.optimizer == formula["host"].optimizer + 4 * len(param_shapes(config))


# ---------------------------------------------------------------- on a GPU


@needs_gpu
@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_step_matches_the_estimator_and_the_allocator(autocast_dtype):
    config = GPTConfig(vocab_size=512, seq_len=128, n_layers=4, n_heads=8, hidden=256, dropout=0.1)
    _step(config, batch=8, device="cuda", autocast_dtype=autocast_dtype)  # warm-up: cuBLAS
    # allocates its workspace through the caching allocator at the first matmul, once
    step = _step(config, batch=8, device="cuda", autocast_dtype=autocast_dtype)
    estimated = estimate_gpt_step(config, 8, device="cuda", autocast_dtype=autocast_dtype)
    _assert_within(step.phases, estimated, rel=0.02)
    # The allocator also holds the batch, the loss and its rounding; saved tensors dominate.
    after_forward = step.cuda["forward"]["allocated"] - step.cuda["init"]["allocated"]
    saved = estimated["forward"].activations + estimated["forward"].weight_copies
    assert saved <= after_forward <= 1.25 * saved
    assert set(cuda_memory()) == {"allocated", "peak", "reserved"}
