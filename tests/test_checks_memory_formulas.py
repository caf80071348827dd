"""Lesson 01's checks of count_gpt_params and zero_model_state
(`dlcourse/checks/memory/count_gpt_params.py`, `zero_model_state.py`), and what every lesson-01
check does with an unwritten, crashing or misused function: the solutions pass, and the wrong
answers students write fail with a message naming the case, the part, expected vs got, and a
hint."""

import math

import pytest

from dlcourse.checks.core import CheckFailed
from dlcourse.checks.memory import (check_count_params, check_mlp_activations,
                                     check_zero_model_state)
from dlcourse.memory import count_params, model_state_bytes
from dlcourse.models import GPT, GPTConfig

GPT_TINY = GPTConfig(n_layers=1, hidden=8, n_heads=1)

# --- count_gpt_params: the solution and the wrong answers students write --------------------


def _layernorm(config):  # one LayerNorm: a scale, and a bias with bias=True
    return 2 * config.hidden if config.bias else config.hidden


def count_gpt_params(config):
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    linear_biases = 9 * h if config.bias else 0  # qkv 3h, proj h, fc 4h, proj h
    block = 12 * h * h + linear_biases + 2 * _layernorm(config)
    lm_head = 0 if config.tie_embeddings else V * h
    return V * h + T * h + L * block + _layernorm(config) + lm_head


def count_without_biases(config):  # forgot the biases: only weights and LayerNorm scales
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    lm_head = 0 if config.tie_embeddings else V * h
    return V * h + T * h + L * (12 * h * h + 2 * h) + h + lm_head


def count_like_the_lesson(config):  # the lesson's formula, whatever bias and tie_embeddings say
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    return V * h + T * h + L * (12 * h * h + 13 * h) + 2 * h


def count_tied_weight_twice(config):  # the output layer's weight added even when tied
    return count_gpt_params(config) + (config.vocab_size * config.hidden
                                       if config.tie_embeddings else 0)


def count_without_layernorms(config):  # forgot LayerNorm has parameters
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    block = 12 * h * h + (9 * h if config.bias else 0)
    return V * h + T * h + L * block + (0 if config.tie_embeddings else V * h)


def count_no_bias_drops_layernorm_scales(config):  # bias=False taken to remove LayerNorm whole
    if config.bias:
        return count_gpt_params(config)
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    return V * h + T * h + L * 12 * h * h + (0 if config.tie_embeddings else V * h)


def count_without_final_layernorm(config):
    return count_gpt_params(config) - _layernorm(config)


def count_untied_head_with_bias(config):  # lm_head given a bias of V when untied
    extra = config.vocab_size if config.bias and not config.tie_embeddings else 0
    return count_gpt_params(config) + extra


def count_by_building_the_model(config):  # the lesson's check, not a count from the config
    return sum(p.numel() for p in GPT(config).parameters())


def count_with_the_library(config):
    return count_params(config)


def test_count_params_solution_passes(capsys):
    check_count_params(count_gpt_params)
    assert "count_gpt_params: passed on 6 configs" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says, hint", [
    (count_without_biases, "bias=True, tie_embeddings=True)): returned 22,056 parameters, the "
                           "model has 22,872: 816 too few", "816 is exactly every bias"),
    (count_like_the_lesson, "hidden=20, bias=False, tie_embeddings=True)): returned 11,300 "
                            "parameters, the model has 10,840: 460 too many",
     "460 is exactly every bias: bias=True gives every Linear and every LayerNorm a bias"),
    (count_tied_weight_twice, "888 too many", "888 is exactly the output layer's (V, h) weight: "
                                              "with tie_embeddings=True, lm_head.weight IS"),
    (count_without_layernorms, "336 too few", "336 is exactly the LayerNorm parameters"),
    (count_no_bias_drops_layernorm_scales, "bias=False, tie_embeddings=True)): returned 10,740 "
                                           "parameters", "100 is exactly the LayerNorm scales"),
    (count_without_final_layernorm, "48 too few", "48 is exactly the final LayerNorm, ln_f"),
    (count_untied_head_with_bias, "bias=True, tie_embeddings=False)): returned 4,477 "
                                  "parameters, the model has 4,448: 29 too many",
     "Hint: print the parameters of a tiny model"),
    (count_by_building_the_model, "built a torch module (GPT, MLPBlock, nn.Linear, ...), which "
                                  "this exercise does not allow", "count Ψ from the config"),
    (count_with_the_library, "called count_params from dlcourse.memory, which this exercise "
                             "does not allow", "count Ψ from the config yourself"),
])
def test_count_params_rejects_plausible_wrong_answers(wrong, says, hint):
    with pytest.raises(CheckFailed) as failed:
        check_count_params(wrong)
    message = str(failed.value)
    assert message.startswith("count_gpt_params(GPTConfig(vocab_size=")
    assert says in message.splitlines()[0] and hint in message


def test_the_guards_are_lifted_after_a_refused_call():
    with pytest.raises(CheckFailed, match="called count_params from dlcourse.memory"):
        check_count_params(count_with_the_library)
    with pytest.raises(CheckFailed, match="built a torch module"):
        check_count_params(count_by_building_the_model)
    assert count_with_the_library(GPT_TINY) == count_by_building_the_model(GPT_TINY)


# --- zero_model_state ----------------------------------------------------------------------

def zero_model_state(n_params, dp, zero_stage, mixed_precision):
    per_param = (2, 2, 12) if mixed_precision else (4, 4, 8)  # params, grads, optimizer
    parts = dict(zip(("params", "grads", "optimizer"), (b * n_params for b in per_param)))
    for part in ("optimizer", "grads", "params")[:zero_stage]:  # what each stage partitions
        parts[part] /= dp
    return parts


def zero_in_whole_parameters(n_params, dp, zero_stage, mixed_precision):
    """A rank holds a whole number of parameters: floor or ceiling of Ψ/N_d, both right."""
    parts = {}
    for part, bytes_each, stage in zip(("params", "grads", "optimizer"),
                                       (2, 2, 12) if mixed_precision else (4, 4, 8), (3, 2, 1)):
        held = math.ceil(n_params / dp) if zero_stage >= stage else n_params
        parts[part] = bytes_each * held
    return parts


def zero_forgot_the_1_over_n(n_params, dp, zero_stage, mixed_precision):
    return zero_model_state(n_params, 1, zero_stage, mixed_precision)


def zero_master_weights_twice(n_params, dp, zero_stage, mixed_precision):
    parts = zero_model_state(n_params, dp, zero_stage, mixed_precision)
    if mixed_precision:  # fp32 master weights added to params, though K = 12 already has them
        parts["params"] += 4 * n_params / (dp if zero_stage == 3 else 1)
    return parts


def zero_divides_params_at_stage_1(n_params, dp, zero_stage, mixed_precision):
    parts = zero_model_state(n_params, 1, 0, mixed_precision)
    for part in ("params", "grads", "optimizer")[:zero_stage]:  # the stages' order reversed
        parts[part] /= dp
    return parts


def zero_stage_off_by_one(n_params, dp, zero_stage, mixed_precision):  # stage s as s + 1
    return zero_model_state(n_params, dp, min(zero_stage + 1, 3), mixed_precision)


def zero_fp32_keeps_master_weights(n_params, dp, zero_stage, mixed_precision):
    parts = zero_model_state(n_params, dp, zero_stage, mixed_precision)
    if not mixed_precision:  # K = 12 in fp32 too: a master copy of weights already in fp32
        parts["optimizer"] *= 12 / 8
    return parts


def zero_total_only(n_params, dp, zero_stage, mixed_precision):
    return sum(zero_model_state(n_params, dp, zero_stage, mixed_precision).values())


def zero_with_the_library(n_params, dp, zero_stage, mixed_precision):
    return model_state_bytes(n_params, dp=dp, zero_stage=zero_stage,
                             mixed_precision=mixed_precision).as_dict()


@pytest.mark.parametrize("solution", [zero_model_state, zero_in_whole_parameters])
def test_zero_model_state_solutions_pass(solution, capsys):
    check_zero_model_state(solution)
    assert "zero_model_state: passed on 12 cases" in capsys.readouterr().out


FIRST_CASE = "zero_model_state(n_params=1,000,003, dp=3, zero_stage=1, mixed_precision=True): "


@pytest.mark.parametrize("wrong, says, hint", [
    (zero_forgot_the_1_over_n, FIRST_CASE + "optimizer is 12,000,036 bytes per rank, expected "
                                            "4,000,012",
     "N_d = 3 times too much: stage 1 partitions the optimizer state"),
    (zero_master_weights_twice, FIRST_CASE + "params is 6,000,018 bytes per rank, expected "
                                             "2,000,006", "K = 12 (fp32 master weights"),
    (zero_divides_params_at_stage_1, FIRST_CASE + "params is 666,668.67 bytes per rank, "
                                                  "expected 2,000,006",
     "stage 1 does not partition the parameters, so every rank keeps all of it"),
    (zero_stage_off_by_one, FIRST_CASE + "grads is 666,668.67 bytes per rank",
     "stage 1 does not partition the gradients"),
    (zero_fp32_keeps_master_weights, "zero_model_state(n_params=6,738,415,616, dp=64, "
                                     "zero_stage=1, mixed_precision=False): optimizer is",
     "no master copy"),
    (zero_total_only, FIRST_CASE + "returned a value of type float, expected a dict",
     "Hint: return {'params': ..., 'grads': ..., 'optimizer': ...}"),
    (zero_with_the_library, FIRST_CASE + "called model_state_bytes from dlcourse.memory",
     "yourself"),
])
def test_zero_model_state_rejects_plausible_wrong_answers(wrong, says, hint):
    with pytest.raises(CheckFailed) as failed:
        check_zero_model_state(wrong)
    message = str(failed.value)
    assert message.splitlines()[0].startswith(says) and hint in message


# --- what every check does with an unwritten, crashing or misused function -----------------

def not_written(*args):
    raise NotImplementedError("Hint: count from the config")


@pytest.mark.parametrize("check, name", [(check_count_params, "count_gpt_params"),
                                         (check_zero_model_state, "zero_model_state"),
                                         (check_mlp_activations, "mlp_activation_bytes")])
def test_an_unwritten_exercise_says_so_with_its_hint(check, name):
    with pytest.raises(CheckFailed, match=f"^{name} is not written yet: .* Hint: count from"):
        check(not_written)


def test_a_crash_names_the_case_and_keeps_the_students_traceback():
    def crashes(config):
        return config.n_embd  # the nanoGPT name; the course calls it hidden

    with pytest.raises(CheckFailed) as failed:
        check_count_params(crashes)
    assert str(failed.value).startswith("count_gpt_params(GPTConfig(vocab_size=37, ")
    assert "raised AttributeError" in str(failed.value)
    assert isinstance(failed.value.__cause__, AttributeError)  # the student's own frame


def test_none_and_the_result_instead_of_the_function_are_explained():
    with pytest.raises(CheckFailed, match="returned None, expected a number of bytes"):
        check_mlp_activations(lambda *args: None)
    with pytest.raises(CheckFailed, match="needs your function itself"):
        check_count_params(count_gpt_params(GPT_TINY))
