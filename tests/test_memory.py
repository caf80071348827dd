"""Lesson 01's formulas against the models and against the papers' published numbers."""

import pytest
import torch

from dlcourse.memory import (REAL_MODELS, activation_bytes, count_params, estimate_gpt_step,
                             gpt_saved_tensors, measure_model_state, memory_per_gpu,
                             model_state_bytes, param_shapes, spec_params)
from dlcourse.models import (GPT, MLP, GPTConfig, MLPConfig, MoEConfig, MoEGPT, lm_loss,
                             synthetic_tokens)

GPT_CONFIGS = [
    GPTConfig(),
    GPTConfig(bias=False),
    GPTConfig(tie_embeddings=False),
    GPTConfig(vocab_size=50, seq_len=12, n_layers=3, n_heads=3, hidden=24, bias=False,
              tie_embeddings=False),
]


# ---------------------------------------------------------------- Ψ


@pytest.mark.parametrize("config", GPT_CONFIGS + [MLPConfig(), MLPConfig(d_in=3, n_layers=4)])
def test_count_params_is_exactly_what_the_model_holds(config):
    model = GPT(config) if isinstance(config, GPTConfig) else MLP(config)
    assert count_params(config) == sum(p.numel() for p in model.parameters())
    assert param_shapes(config) == {n: tuple(p.shape) for n, p in model.named_parameters()}


MOE_CONFIGS = [
    MoEConfig(),
    MoEConfig(n_layers=3, moe_every=2, n_experts=6, top_k=1, expert_hidden=40, bias=False),
    MoEConfig(vocab_size=50, seq_len=12, n_layers=2, n_heads=3, hidden=24, n_experts=8, top_k=3,
              tie_embeddings=False, capacity_factor=1.25),
]


@pytest.mark.parametrize("config", MOE_CONFIGS)
def test_count_params_of_an_moe_is_what_the_model_holds(config):
    model = MoEGPT(config)
    assert count_params(config) == sum(p.numel() for p in model.parameters())
    assert param_shapes(config) == {n: tuple(p.shape) for n, p in model.named_parameters()}
    # active: every parameter outside the experts, and k/E of the experts' (all E alike)
    experts = [p for moe in model.moe_layers() for p in moe.experts.parameters()]
    ids = {id(p) for p in experts}
    dense = sum(p.numel() for p in model.parameters() if id(p) not in ids)
    held = sum(p.numel() for p in experts)
    assert held % config.n_experts == 0
    assert count_params(config, active=True) == dense + held // config.n_experts * config.top_k
    assert count_params(config, active=True) < count_params(config)


def test_count_params_active_of_a_dense_gpt_is_its_total():
    config = GPT_CONFIGS[-1]
    assert count_params(config, active=True) == count_params(config)


def test_count_params_matches_published_gpt2_sizes():
    # GPT-2 small as released: 124,439,808 parameters (tied embeddings, 1024 learned positions).
    gpt2 = GPTConfig(vocab_size=50257, seq_len=1024, n_layers=12, n_heads=12, hidden=768)
    assert count_params(gpt2) == 124_439_808
    assert spec_params(REAL_MODELS["GPT-2 small"]) == count_params(gpt2)


@pytest.mark.parametrize("name, published", [
    ("GPT-2 medium", 354_823_168), ("GPT-2 large", 774_030_080), ("GPT-2 XL", 1_557_611_200),
    ("Llama-2 7B", 6_738_415_616), ("Llama-2 13B", 13_015_864_320),
    ("Llama-2 70B", 68_976_648_192),
])
def test_real_model_parameter_counts_match_the_released_checkpoints(name, published):
    assert spec_params(REAL_MODELS[name]) == published


def test_count_params_refuses_other_things():
    with pytest.raises(TypeError, match="GPTConfig or an MLPConfig"):
        count_params({"hidden": 64})


# ---------------------------------------------------------------- ZeRO (Rajbhandari et al. 2019)


def _close_to_printed(value, printed):
    """`value` agrees with a number the paper printed to its last digit: within one unit of
    that digit (the paper rounds most entries, truncates a few, e.g. 513.5 printed as 513)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(value - float(printed)) < 10**-decimals


def _gb(n_params, dp, stage):
    return model_state_bytes(n_params, dp=dp, zero_stage=stage).total / 1e9  # the paper's GB


def test_zero_figure_1():
    # Figure 1: Ψ = 7.5B, N_d = 64, K = 12: baseline 120 GB, P_os 31.4, P_os+g 16.6, P_os+g+p 1.9.
    for stage, printed in enumerate(["120", "31.4", "16.6", "1.9"]):
        assert _close_to_printed(_gb(7.5e9, 64, stage), printed), (stage, _gb(7.5e9, 64, stage))


# Table 1: per-device memory (GB) of P_os, P_os+g, P_os+g+p by DP degree, for 7.5B, 128B, 1T.
ZERO_TABLE_1 = {
    1: ["120", "120", "120", "2048", "2048", "2048", "16000", "16000", "16000"],
    4: ["52.5", "41.3", "30", "896", "704", "512", "7000", "5500", "4000"],
    16: ["35.6", "21.6", "7.5", "608", "368", "128", "4750", "2875", "1000"],
    64: ["31.4", "16.6", "1.88", "536", "284", "32", "4187.5", "2218.75", "250"],
    256: ["30.4", "15.4", "0.47", "518", "263", "8", "4046.9", "2054.7", "62.5"],
    1024: ["30.1", "15.1", "0.12", "513", "257", "2", "4011.7", "2013.7", "15.6"],
}


@pytest.mark.parametrize("dp", ZERO_TABLE_1)
def test_zero_table_1(dp):
    cells = zip([n for n in (7.5e9, 128e9, 1e12) for _ in range(3)], [1, 2, 3] * 3, ZERO_TABLE_1[dp])
    for n_params, stage, printed in cells:
        got = _gb(n_params, dp, stage)
        assert _close_to_printed(got, printed), f"Ψ={n_params:.3g} N_d={dp} stage {stage}: {got}"


def test_fp32_model_state_is_what_adamw_really_holds():
    config = GPTConfig(dropout=0.0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = synthetic_tokens(2, config)
    lm_loss(model(x), y).backward()
    optimizer.step()
    measured = measure_model_state(model, optimizer)
    formula = model_state_bytes(count_params(config), mixed_precision=False)
    assert (measured.params, measured.grads) == (formula.params, formula.grads)
    # torch's AdamW adds a 4-byte step counter per parameter tensor to ZeRO's K = 8 bytes.
    assert measured.optimizer == formula.optimizer + 4 * len(param_shapes(config))


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero_stage=4), "zero_stage must be one of"),
    (dict(dp=0), "dp .N_d. must be a whole number"),
    (dict(dp=2.5), "dp .N_d. must be a whole number"),
    (dict(K=-1), "K is bytes"),
])
def test_model_state_bytes_says_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        model_state_bytes(1000, **kwargs)


# ---------------------------------------------------------------- Korthikanti et al. 2022


# Table 2, per transformer layer, typed from the paper; (recompute, sequence parallel) -> bytes.
def _table_2(s, b, h, a, t):
    return {
        ("none", False): s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): s * b * h * (34 / t + 5 * a * s / (h * t)),
        ("selective", False): s * b * h * (10 + 24 / t),
        ("selective", True): s * b * h * (34 / t),
    }


# Table 3's models: (heads, hidden, layers, tensor-parallel size, micro-batch), s = 2048.
PAPER_MODELS = {"22B": (64, 6144, 48, 8, 4), "175B": (96, 12288, 96, 8, 1),
                "530B": (128, 20480, 105, 8, 1), "1T": (160, 25600, 128, 8, 1)}


@pytest.mark.parametrize("name", PAPER_MODELS)
@pytest.mark.parametrize("tp", [1, "paper"])
def test_korthikanti_table_2(name, tp):
    a, h, layers, t, b = PAPER_MODELS[name]
    t = t if tp == "paper" else 1
    for (recompute, sp), expected in _table_2(2048, b, h, a, t).items():
        got = activation_bytes(2048, b, h, a, layers=layers, tp=t, sequence_parallel=sp,
                               recompute=recompute)
        assert got == pytest.approx(expected * layers, rel=1e-12), (recompute, sp)
    full = activation_bytes(2048, b, h, a, tp=t, recompute="full")
    assert full == pytest.approx(2048 * b * h * 2, rel=1e-12)  # Table 2: sbh·2


def test_korthikanti_no_parallelism_is_34_plus_5as_over_h():
    s, b, h, a = 2048, 1, 12288, 96
    assert activation_bytes(s, b, h, a) == pytest.approx(s * b * h * (34 + 5 * a * s / h))


@pytest.mark.parametrize("name, saved", [("175B", 0.70), ("530B", 0.65)])
def test_selective_recompute_saves_what_the_paper_says(name, saved):
    # Section 4.2: selective recomputation saves 70% of GPT-3's activations, 65% of MT-NLG's.
    a, h, *_ = PAPER_MODELS[name]
    fraction = 1 - activation_bytes(2048, 1, h, a, recompute="selective") / activation_bytes(2048, 1, h, a)
    assert round(fraction, 2) == saved


def test_activation_bytes_says_what_is_wrong():
    with pytest.raises(ValueError, match="recompute must be"):
        activation_bytes(128, 1, 64, 4, recompute="some")
    with pytest.raises(ValueError, match="heads must be a whole number"):
        activation_bytes(128, 1, 64, 0)


def test_korthikanti_with_our_dtypes_is_the_course_gpt_blocks():
    """With 4-byte values and masks (fp32 on CPU), sbh(72 + 12as/h) per layer is exactly the
    course GPT's block rows, less what the paper leaves out: LayerNorm statistics and the
    causal mask."""
    config, batch = GPTConfig(n_layers=3, dropout=0.1), 2
    rows = [r for r in gpt_saved_tensors(config, batch) if r.where == "block"]
    extra = [r for r in rows if "mean and 1/std" in r.what or "causal mask" in r.what]
    course = sum(r.nbytes for r in rows) - sum(r.nbytes for r in extra)
    paper = activation_bytes(config.seq_len, batch, config.hidden, config.n_heads,
                             layers=config.n_layers, bytes_per_value=4, mask_bytes=4)
    assert course == paper


# ---------------------------------------------------------------- calculator


def test_calculator_model_state_is_zero_s_16_psi_and_shrinks_with_zero():
    spec = REAL_MODELS["Llama-2 7B"]
    alone = memory_per_gpu(spec, dp=1, zero_stage=0)
    assert alone.model_state == 16 * spec_params(spec)
    sharded = memory_per_gpu(spec, dp=8, zero_stage=3)
    assert sharded.model_state == pytest.approx(alone.model_state / 8)
    assert sharded.activations == alone.activations  # ZeRO-DP leaves activations alone


def test_estimator_rejects_unknown_settings():
    with pytest.raises(ValueError, match="no dtype rules"):
        estimate_gpt_step(GPTConfig(), 2, autocast_dtype=torch.float16)  # CPU autocast is bf16 here
    with pytest.raises(ValueError, match="optimizer must be one of"):
        estimate_gpt_step(GPTConfig(), 2, optimizer="lion")
