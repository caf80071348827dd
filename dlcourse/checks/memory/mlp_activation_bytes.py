"""Lesson 01, exercise 3 (`exercises/01_memory.ipynb`): `check_mlp_activations`, the bytes an MLP
block saves for backward on CPU, predicted from the shapes and compared with a real block's
forward measured by `SavedTensorLog`.
"""

import torch

from dlcourse.checks.core import fail, fresh_cases
from dlcourse.checks.memory.calls import answer, expect_number, num
from dlcourse.memory import SavedTensorLog, estimate_gpt_step, gpt_saved_tensors, measure_step
from dlcourse.models import GPTConfig, MLPBlock


# (batch, seq_len, hidden, dropout, dtype): odd shapes, dropout off and on, three dtypes.
MLP_CASES = [
    (3, 5, 24, 0.1, torch.float32),
    (2, 7, 12, 0.0, torch.float32),
    (1, 9, 20, 0.25, torch.bfloat16),
    (5, 3, 8, 0.5, torch.float64),
]

MLP_HINT = ("for each op of h -> fc -> GELU -> proj -> dropout, ask what its backward needs: a "
            "Linear its input (for the weight's gradient), GELU its input, dropout its mask when "
            "dropout > 0 (on CPU a tensor of the activations' dtype). To see them, in a cell of "
            "your own as in lesson 01: `with SavedTensorLog(mlp) as log: out = mlp(x)`, then "
            "print `log.records`")


@fresh_cases
def check_mlp_activations(mlp_activation_bytes, *, rng):
    """mlp_activation_bytes(batch, seq_len, hidden, dropout, dtype) must return the bytes of the
    tensors the course GPT's MLP block (`dlcourse.models.MLPBlock`), in `dtype` on CPU, saves
    for backward in training mode: what SavedTensorLog measures."""
    __tracebackhide__ = True
    drawn = (rng.randint(1, 6), rng.randint(1, 12), rng.randint(2, 32), rng.choice((0.0, 0.2)),
             rng.choice((torch.float32, torch.float64, torch.bfloat16)))
    cases = MLP_CASES + [drawn]
    for batch, seq_len, hidden, dropout, dtype in cases:
        args = (batch, seq_len, hidden, dropout, dtype)
        where = (f"mlp_activation_bytes(batch={batch}, seq_len={seq_len}, hidden={hidden}, "
                 f"dropout={dropout}, dtype={dtype})")
        got = answer(mlp_activation_bytes, args, exercise="mlp_activation_bytes", where=where,
                     forbidden=(SavedTensorLog, measure_step, gpt_saved_tensors,
                                estimate_gpt_step),
                     why="predict the bytes from the shapes; measuring them is the check's job")
        expect_number(got, where=where, unit="bytes", hint=MLP_HINT)
        expected = _measure_mlp_block(*args)
        if got != expected:
            unit = batch * seq_len * hidden * dtype.itemsize  # one (B, T, h) tensor in dtype
            fail(where, None, f"returned {num(got)} bytes, the block saved {num(expected)}",
                 f"counted in (B, T, h) tensors of {dtype.itemsize}-byte values, yours is "
                 f"{got / unit:g} of them, the block's {expected / unit:g}; {MLP_HINT}")
    print(f"mlp_activation_bytes: passed on {len(cases)} shapes (dropout on and off; "
          "float32, bfloat16, float64), each equal to a SavedTensorLog measurement")


def _measure_mlp_block(batch, seq_len, hidden, dropout, dtype):
    """Bytes the real block saves for backward, as lesson 01 measures them."""
    config = GPTConfig(hidden=hidden, n_heads=1, dropout=dropout)
    block = MLPBlock(config).to(dtype)  # a new module is in training mode: dropout is on
    x = torch.randn(batch, seq_len, hidden, dtype=dtype, requires_grad=True)  # (B, T, h)
    with SavedTensorLog(block) as log:
        out = block(x)  # noqa: F841 (the graph behind `out` holds the saved tensors: keep it)
    # x counts: fc saves it for its weight's gradient, as Korthikanti et al. count it.
    return log.live_bytes()["activations"]
