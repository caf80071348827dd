"""Memory of a training step: the papers' formulas, measurements, an estimator (lesson 01).

- `accounting`: `count_params`, `model_state_bytes` (ZeRO), `activation_bytes` (Korthikanti).
- `measure`: what a real step holds, read from the tensors: `measure_model_state`,
  `measure_step`, `peak_activations`, `SavedTensorLog` (through
  `torch.autograd.graph.saved_tensors_hooks`).
- `estimate`: the course GPT's saved tensors listed one by one: `estimate_gpt_step`.
- `peak`: the true peak of a step, every allocation counted (`measure_peak`).
- `recompute`: activation checkpointing (`checkpoint_blocks`) and its cost (`step_flops`).
- `offload`: optimizer state in host memory (`OffloadAdamW`, `offload_bytes`).
- `calculator`: bytes per GPU for GPT-2 and Llama 2 (`memory_per_gpu`, `REAL_MODELS`).
"""

from dlcourse.memory.accounting import (MemoryParts, activation_bytes, count_params,
                                        model_state_bytes, param_shapes)
from dlcourse.memory.calculator import REAL_MODELS, fits, memory_per_gpu, spec_params
from dlcourse.memory.estimate import estimate_gpt_step, gpt_saved_tensors
from dlcourse.memory.measure import (SavedTensorLog, StepMemory, cuda_memory, measure_model_state,
                                     measure_step, peak_activations, storage_bytes)
from dlcourse.memory.offload import OffloadAdamW, offload_bytes
from dlcourse.memory.peak import PeakMemory, measure_peak
from dlcourse.memory.recompute import checkpoint_blocks, step_flops

__all__ = [
    "MemoryParts", "activation_bytes", "count_params", "model_state_bytes", "param_shapes",
    "REAL_MODELS", "fits", "memory_per_gpu", "spec_params",
    "estimate_gpt_step", "gpt_saved_tensors",
    "SavedTensorLog", "StepMemory", "cuda_memory", "measure_model_state", "measure_step",
    "peak_activations", "storage_bytes", "OffloadAdamW", "PeakMemory", "measure_peak",
    "offload_bytes",
    "checkpoint_blocks", "step_flops",
]
