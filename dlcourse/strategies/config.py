"""The configuration every strategy of the catalogue is built from (`dlcourse tour`, lesson 10's
divergence finder and the benchmarks share it; the finder's `DebugConfig` is a smaller one)."""

from dataclasses import dataclass, field

import torch

from dlcourse.models import GPT, GPTConfig, synthetic_tokens

# Rounding: a sum over 4 ranks adds the same fp32 numbers in another order (~1e-7 relative).
# AdamW divides each update by sqrt(v); for a gradient element near zero that turns rounding
# noise into a step of up to ~lr. Measured after 5 steps at lr 1e-3: DDP 2.5e-6, SGD 7e-9.
MATCH_TOLERANCE = 1e-5


@dataclass
class StrategyConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    global_batch: int = 16  # sequences per optimizer step, split evenly over the ranks
    steps: int = 5  # optimizer steps
    lr: float = 1e-3  # AdamW learning rate
    seed: int = 0  # weights; the data uses seed + 1
    cuda: bool = False  # on nccl: each rank (and the reference) on its own current GPU
    dtype: torch.dtype = torch.float32  # the finder's float64 makes a correct strategy exact
    max_grad_norm: float | None = None  # clip by the global norm (ZeRO's; torch's in the reference)
    micro_batches: int = 1  # lesson 03's strategies: gradient accumulation over this many pieces
    bucket_cap_mb: float = 25.0  # DP's and ZeRO 1-2's gradient buckets (DDP's default)
    pipeline_micro_batches: int = 4  # lesson 06's strategies: micro-batches per step per pipeline

    def device(self):
        if self.cuda:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def new_model(self):
        """The course GPT as every strategy starts it: same seed, on this process's device."""
        return GPT(self.model, seed=self.seed).to(self.device(), self.dtype)

    def data(self):
        """The global batch (inputs, targets), each (global_batch, seq_len), on the device."""
        x, y = synthetic_tokens(self.global_batch, self.model, seed=self.seed + 1)
        return x.to(self.device()), y.to(self.device())


TourConfig = StrategyConfig  # the name `dlcourse tour` and lesson 07 know it by
