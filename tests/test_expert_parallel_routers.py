"""Lesson 09's router and expert variants, single process against plain references (`moe.py`):
DeepSeek-V3's sigmoid scores with the top-k normalised, the router computed in float32 in a
bfloat16 model, ST-MoE's router z-loss, DeepSeekMoE's shared experts (one MLP of width n·f =
the sum of n expert MLPs) and fine-grained split (the same expert parameters). float64 where
exact; the references are loops over tokens and experts written from the papers' equations."""

import math

import pytest
import torch
import torch.nn.functional as F

from dlcourse.models import MoEConfig, MoEGPT, lm_loss, moe_loss, synthetic_tokens
from dlcourse.moe import (MoE, SharedExperts, fine_grained, route, router_logits,
                          router_z_loss)
from dlcourse.parallel.expert.measure import param_bytes, params_per_token

CFG = MoEConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16, n_experts=8)


def test_sigmoid_routing_is_deepseek_v3s_normalised_top_k():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 8, generator=gen, dtype=torch.float64)
    probs, weights, experts = route(logits, 3, "sigmoid")
    for n in range(12):
        s = [1 / (1 + math.exp(-v)) for v in logits[n].tolist()]  # eq. 15: s = sigmoid(u·e)
        chosen = sorted(range(8), key=lambda e: -s[e])[:3]  # eq. 14: the top-k of s
        total = sum(s[e] for e in chosen)  # eq. 13: normalised over the chosen
        assert experts[n].tolist() == chosen
        assert weights[n].tolist() == pytest.approx([s[e] / total for e in chosen], abs=1e-15)
        assert probs[n].tolist() == pytest.approx([v / sum(s) for v in s], abs=1e-15)
    softmax_probs, softmax_weights, _ = route(logits, 3)
    assert not torch.allclose(softmax_weights, weights)  # a different gate, not softmax renamed
    with pytest.raises(ValueError, match="unknown router score 'relu'"):
        route(logits, 3, "relu")


def test_router_runs_in_float32_in_a_bfloat16_model():
    layer = MoE(CFG)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(std=0.2)
    layer.to(torch.bfloat16)
    x = torch.randn(64, 16).to(torch.bfloat16)
    got = router_logits(layer.router, x)
    want = x.float() @ layer.router.weight.float().T  # the same bf16 values, multiplied in fp32
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert not torch.equal(layer.router(x).float(), want)  # bf16 matmul rounds its output
    y = layer(x.view(4, 16, 16))
    assert y.dtype == torch.bfloat16
    wide = torch.randn(5, 16, dtype=torch.float64)
    assert router_logits(layer.router.double(), wide).dtype == torch.float64  # never narrower


def test_z_loss_is_the_mean_squared_log_partition_function():
    logits = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 6
    assert router_z_loss(logits).item() == pytest.approx(want, rel=1e-14)


def test_moe_loss_adds_z_loss_coef_times_every_blocks_z_loss():
    config = MoEConfig(**{**CFG.__dict__, "z_loss_coef": 1e-3})
    model = MoEGPT(config).double()
    x, y = synthetic_tokens(2, config, seed=1)
    logits = model(x)
    z = sum(router_z_loss(router_logits(m.router, h)) for m, h in _moe_inputs(model, x))
    want = lm_loss(logits, y) + 0.01 * model.aux_loss() + 1e-3 * z
    assert moe_loss(model, logits, y).item() == pytest.approx(want.item(), rel=1e-14)
    assert model.z_loss().item() == pytest.approx(z.item(), rel=1e-14)


def _moe_inputs(model, x):
    """(MoE layer, its (N, h) input) for each MoE block of one forward, caught by hooks."""
    seen = []
    hooks = [m.register_forward_hook(lambda m, inp, out: seen.append((m, inp[0].flatten(0, 1))))
             for m in model.moe_layers()]
    model(x)
    for hook in hooks:
        hook.remove()
    return seen


def test_shared_experts_are_the_sum_of_n_expert_mlps():
    shared = SharedExperts(3, 16, 24).double()
    x = torch.randn(10, 16, dtype=torch.float64)
    want = sum(F.linear(F.gelu(F.linear(x, shared.fc.weight[24 * i:24 * (i + 1)],
                                        shared.fc.bias[24 * i:24 * (i + 1)])),
                        shared.proj.weight[:, 24 * i:24 * (i + 1)])
               for i in range(3)) + shared.proj.bias  # n MLPs h -> 24 -> h, their outputs added
    torch.testing.assert_close(shared(x), want, rtol=1e-13, atol=1e-13)


def test_moe_with_shared_experts_adds_them_to_the_routed_output_of_every_token():
    config = MoEConfig(**{**CFG.__dict__, "n_shared_experts": 2})
    with_shared = MoE(config).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # GroupedLinear's weights start as torch.empty: draw them
        for p in with_shared.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    routed = MoE(CFG).double()
    routed.load_state_dict({k: v for k, v in with_shared.state_dict().items()
                            if not k.startswith("shared.")})
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    want = routed(x) + with_shared.shared(x.view(16, 16)).view(2, 8, 16)
    torch.testing.assert_close(with_shared(x), want, rtol=1e-13, atol=1e-13)


def test_fine_grained_keeps_expert_parameters_and_flops_and_grows_only_the_router():
    base = MoEConfig(**{**CFG.__dict__, "top_k": 2, "n_shared_experts": 1, "bias": False})
    fine = fine_grained(base, 4)
    assert (fine.n_experts, fine.top_k, fine.ffn_hidden, fine.n_shared_experts) == (32, 8, 16, 4)
    grow = len(base.moe_blocks) * (fine.n_experts - base.n_experts) * base.hidden  # routers
    for key in ("total", "active"):
        assert params_per_token(fine)[key] == params_per_token(base)[key] + grow
    for config in (base, fine, fine_grained(MoEConfig(**{**CFG.__dict__, "n_shared_experts": 1}), 2)):
        # the formula counts what the model holds, biases and shared experts included
        assert params_per_token(config)["total"] == sum(p.numel() for p in MoEGPT(config).parameters())
        assert sum(param_bytes(config, 1, itemsize=1).values()) == params_per_token(config)["total"]
    with pytest.raises(ValueError, match=r"m = 3 does not divide the expert width 64"):
        fine_grained(base, 3)


@pytest.mark.parametrize("field, value, match", [
    ("n_shared_experts", -1, "n_shared_experts must be a whole number >= 0"),
    ("score_func", "tanh", "score_func must be 'softmax' or 'sigmoid'"),
    ("z_loss_coef", -1e-3, "z_loss_coef must be >= 0")])
def test_config_refuses_bad_router_settings(field, value, match):
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**CFG.__dict__, field: value})
