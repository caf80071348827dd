"""The strategies the divergence finder can examine (lesson 10, `lessons/10_debugging.ipynb`):
every entry of the catalogue (`dlcourse.strategies`), seen through what the finder needs of it.

The finder runs a strategy's `Trainer` (its modules named like the plain GPT's, for the forward
hooks; its optimizer, whose step is intercepted to read the gradients; a step on the global
batch; the strategy's own unshard helper `full_parameters`) beside one process, on a
`DebugConfig`: a GPT small enough for a test, in float64 so that a correct strategy matches to
~1e-15. `SUBJECTS` is the catalogue keyed by name, each at the world size the finder runs it on.

    SUBJECTS["TP + SP (lesson 04)"].build(DebugConfig())   # on every rank of a 2-rank job
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlcourse.models import GPTConfig
from dlcourse.strategies import CATALOGUE, StrategyConfig
from dlcourse.strategies import combine as grid_strategies
from dlcourse.strategies.expert import moe_model
from dlcourse.strategies.tensor import TP_DROPOUT
from dlcourse.strategies.trainer import Trainer as Subject

__all__ = ["SUBJECTS", "TP_DROPOUT", "DebugConfig", "Subject", "grid_subject", "moe_model"]


@dataclass
class DebugConfig(StrategyConfig):
    # a GPT small enough for a test: 2 blocks, 2 heads (tp = 2 divides them), 8 tokens
    model: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16))
    global_batch: int = 4  # sequences per step (5 for an uneven split over 2 ranks)
    steps: int = 2  # optimizer steps compared
    dtype: torch.dtype = torch.float64  # float64: a correct strategy matches to ~1e-15
    pipeline_micro_batches: int = 2  # a bug that scales with them (undivided losses) shows x2


@dataclass(frozen=True)
class FinderView:
    """A catalogue entry as the finder runs it: at `world_size` ranks, `build(cfg)` on each."""
    strategy: object  # the catalogue's `Strategy`

    @property
    def world_size(self):
        return self.strategy.finder_ranks

    @property
    def config(self):  # DebugConfig fields it needs (a case without one)
        return self.strategy.finder_config

    @property
    def reference(self):
        return self.strategy.reference

    @property
    def loss(self):
        return self.strategy.loss

    @property
    def note(self):
        return self.strategy.note

    def build(self, cfg):
        """On every rank: the groups of the grid it needs at this job's size, then its Trainer."""
        grid = self.strategy.check(cfg, dist.get_world_size())
        return self.strategy.build(cfg, grid.new_groups())


def grid_subject(plan, cfg):
    """Lesson 07's `GridTrainer` for `plan` as the finder's Subject (exercises build their own
    plans); ZeRO clips with cfg.max_grad_norm."""
    return grid_strategies.build(plan, cfg, plan.grid.new_groups())


SUBJECTS = {name: FinderView(strategy) for name, strategy in CATALOGUE.items() if strategy.finder}
