"""Lesson 01's check of mlp_activation_bytes (`dlcourse/checks/memory/mlp_activation_bytes.py`): the
solution passes, and the wrong answers students write fail with a message naming the case, expected
vs got, and a hint."""

import pytest
import torch

from dlcourse.checks.core import CheckFailed
from dlcourse.checks.memory import check_mlp_activations
from dlcourse.memory import SavedTensorLog
from dlcourse.models import GPTConfig, MLPBlock

# --- mlp_activation_bytes ------------------------------------------------------------------

def mlp_activation_bytes(batch, seq_len, hidden, dropout, dtype):
    values = batch * seq_len * hidden  # one (B, T, h) tensor
    saved = values + 4 * values + 4 * values  # fc's input, GELU's input, proj's input
    masks = values if dropout > 0 else 0  # CPU dropout's mask: a tensor of the input's dtype
    return (saved + masks) * dtype.itemsize


def mlp_mask_in_2_bytes(batch, seq_len, hidden, dropout, dtype):
    values = batch * seq_len * hidden
    return 9 * values * dtype.itemsize + (2 * values if dropout > 0 else 0)


def mlp_mask_without_dropout(batch, seq_len, hidden, dropout, dtype):  # p = 0 still masks
    return 10 * batch * seq_len * hidden * dtype.itemsize


def mlp_forgot_gelu_output(batch, seq_len, hidden, dropout, dtype):  # 4h once, not twice
    return mlp_activation_bytes(batch, seq_len, hidden, dropout, dtype) - (
        4 * batch * seq_len * hidden * dtype.itemsize)


def mlp_forgot_the_input(batch, seq_len, hidden, dropout, dtype):  # "the input is not mine"
    return mlp_activation_bytes(batch, seq_len, hidden, dropout, dtype) - (
        batch * seq_len * hidden * dtype.itemsize)


def mlp_korthikanti_19_sbh(batch, seq_len, hidden, dropout, dtype):  # the paper's 16-bit GPU count
    return 19 * seq_len * batch * hidden


def mlp_always_4_bytes(batch, seq_len, hidden, dropout, dtype):  # float32 whatever dtype says
    return mlp_activation_bytes(batch, seq_len, hidden, dropout, torch.float32)


def mlp_measured(batch, seq_len, hidden, dropout, dtype):  # the check's job, not a prediction
    block = MLPBlock(GPTConfig(hidden=hidden, n_heads=1, dropout=dropout)).to(dtype)
    with SavedTensorLog(block) as log:
        out = block(torch.randn(batch, seq_len, hidden, dtype=dtype))  # noqa: F841
    return log.live_bytes()["activations"]


def test_mlp_activations_solution_passes(capsys):
    check_mlp_activations(mlp_activation_bytes)
    assert "mlp_activation_bytes: passed on 5 shapes" in capsys.readouterr().out


FIRST_MLP = "mlp_activation_bytes(batch=3, seq_len=5, hidden=24, dropout=0.1, dtype=torch.float32)"


@pytest.mark.parametrize("wrong, says, hint", [
    (mlp_mask_in_2_bytes, FIRST_MLP + ": returned 13,680 bytes, the block saved 14,400",
     "4-byte values, yours is 9.5 of them, the block's 10"),
    (mlp_mask_without_dropout, "dropout=0.0, dtype=torch.float32): returned 6,720 bytes, the "
                               "block saved 6,048", "yours is 10 of them, the block's 9"),
    (mlp_forgot_gelu_output, FIRST_MLP + ": returned 8,640 bytes", "yours is 6 of them"),
    (mlp_forgot_the_input, FIRST_MLP + ": returned 12,960 bytes", "yours is 9 of them"),
    (mlp_korthikanti_19_sbh, FIRST_MLP + ": returned 6,840 bytes", "yours is 4.75 of them"),
    (mlp_always_4_bytes, "dtype=torch.bfloat16): returned 7,200 bytes, the block saved 3,600",
     "(B, T, h) tensors of 2-byte values, yours is 20 of them"),
    (mlp_measured, FIRST_MLP + ": built a torch module", "predict the bytes from the shapes"),
])
def test_mlp_activations_reject_plausible_wrong_answers(wrong, says, hint):
    with pytest.raises(CheckFailed) as failed:
        check_mlp_activations(wrong)
    message = str(failed.value)
    assert says in message.splitlines()[0] and hint in message


def test_measuring_with_the_library_log_is_refused_too():
    def measured_without_a_module(batch, seq_len, hidden, dropout, dtype):
        with SavedTensorLog() as log:  # no module built, but the measurement itself
            pass
        return log.live_bytes()["activations"]

    with pytest.raises(CheckFailed, match="called SavedTensorLog from dlcourse.memory, which this "
                                          "exercise does not allow"):
        check_mlp_activations(measured_without_a_module)


def test_a_not_implemented_error_from_torch_is_not_the_stub():
    def unsupported(batch, seq_len, hidden, dropout, dtype):
        raise NotImplementedError("\"addmm_impl_cpu_\" not implemented for 'Half'")

    with pytest.raises(CheckFailed) as failed:
        check_mlp_activations(unsupported)
    assert str(failed.value).startswith(FIRST_MLP + ": raised NotImplementedError: \"addmm")
