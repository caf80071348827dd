"""Checks for lesson 01's exercises (`exercises/01_memory.ipynb`): predict memory before it is used.

    check_count_params(count_gpt_params)          Ψ of GPT(config), from the config alone
    check_zero_model_state(zero_model_state)      bytes of params, grads, optimizer per ZeRO rank
    check_mlp_activations(mlp_activation_bytes)   bytes an MLP block saves for backward on CPU

The answers are formulas, so each check calls the student's function in this process (no ranks
needed) on cases the notebook never shows, and compares it with a reference that shares no code
with a solution:
- Ψ: `sum(p.numel() for p in GPT(config).parameters())` of the real model (a tied weight is one
  Parameter, listed once);
- model state: ZeRO's accounting, `dlcourse.memory.model_state_bytes`, which
  tests/test_memory.py holds against the paper's Figure 1;
- activations: a real MLP block's forward, measured with `SavedTensorLog`.
While the student's function runs, building a model and the library functions that hand out the
answer raise: the exercise is to know the bytes before anything is allocated, as one must for a
model of 70 billion parameters. One module per exercise (`count_gpt_params.py`,
`zero_model_state.py`, `mlp_activation_bytes.py`); `calls.py` calls the student's function and reads
what it returned.
"""

from dlcourse.checks.memory.count_gpt_params import check_count_params
from dlcourse.checks.memory.mlp_activation_bytes import check_mlp_activations
from dlcourse.checks.memory.zero_model_state import check_zero_model_state

__all__ = ["check_count_params", "check_zero_model_state", "check_mlp_activations"]
