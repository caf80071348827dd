"""The training run lesson 11 interrupts: everything a step depends on, in one object (lesson 11,
`lessons/11_checkpoints.ipynb`).

Lesson 04's tensor-parallel GPT with dropout on every rank of `group`, so a step draws random
numbers from two streams: the default generator (the residual dropouts, alike on every rank) and
each rank's own "tensor-parallel" stream in lesson 04's `RNGTracker` (the attention dropout,
different per rank). AdamW with a learning-rate schedule (linear warm-up), and a data stream that
shuffles its sequences afresh each epoch. A step changes five things: the parameters, AdamW's
moments and step count, the schedule's step, both random streams, the data position.
"""

import io
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.models import GPT, GPTConfig, synthetic_tokens
from dlcourse.parallel.tensor import full_parameters, parallelize, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.compare import step as tp_step
from dlcourse.parallel.tensor.rng import seed_tensor_parallel


@dataclass
class RunConfig:
    # a GPT small enough for a test: 2 blocks, 2 heads (tp = 2 divides them), dropout on
    model: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16, dropout=0.1))
    n_sequences: int = 20  # the data set; 20 / batch 4 = an epoch of 5 steps
    batch: int = 4  # sequences per step (the same batch on every tp rank)
    lr: float = 1e-2  # peak learning rate, reached after `warmup` steps
    warmup: int = 4  # linear warm-up: step i trains at lr * min(1, (i + 1) / warmup)
    seed: int = 0
    dtype: torch.dtype = torch.float64  # float64: a resume must match to the last bit anyway


class DataStream:
    """Batches of `batch` sequences from (x, y), a fresh shuffle each epoch (from seed + epoch).
    Its position, (epoch, index), is all a resume needs: the order is recomputed from the seed."""

    def __init__(self, x, y, batch, seed):
        self.x, self.y, self.batch, self.seed = x, y, batch, seed
        self.epoch, self.index = 0, 0  # the next batch: sequences order[index : index + batch]

    def _order(self):
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.x), generator=gen)

    def next(self):
        if self.index + self.batch > len(self.x):  # the rest of an epoch is dropped
            self.epoch, self.index = self.epoch + 1, 0
        rows = self._order()[self.index:self.index + self.batch]
        self.index += self.batch
        return self.x[rows], self.y[rows]  # (B, T) each

    def state_dict(self):
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state):
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def warmup_lambda(warmup, step):
    return min(1.0, (step + 1) / warmup)


class TrainRun:
    """One rank's part of the run, started afresh: seeds, weights, optimizer, schedule, data."""

    def __init__(self, cfg, group):
        self.cfg, self.group, self.steps_done = cfg, group, 0
        model = GPT(cfg.model, seed=cfg.seed).to(cfg.dtype)
        self.tracker = seed_tensor_parallel(cfg.seed, group)  # default stream + this rank's
        self.model = parallelize(model, group, tracker=self.tracker)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(warmup_lambda, cfg.warmup))
        x, y = synthetic_tokens(cfg.n_sequences, cfg.model, seed=cfg.seed)
        self.data = DataStream(x, y, cfg.batch, cfg.seed)
        self.loss_fn = partial(vocab_parallel_lm_loss, group=group)

    def step(self):
        """One training step on the next batch; returns the loss."""
        x, y = self.data.next()
        loss = tp_step(self.model, self.optimizer, self.loss_fn, x, y)
        self.scheduler.step()
        self.steps_done += 1
        return loss.item()

    def full_parameters(self):
        """{name: whole parameter}, gathered over the tp group (call on every rank)."""
        return full_parameters(self.model, self.group)


def trained(cfg, k):
    """A fresh run on every rank of the world, trained k steps."""
    run = TrainRun(cfg, dist.group.WORLD)
    for _ in range(k):
        run.step()
    return run


def through_bytes(state):
    """`state` saved with torch.save and loaded back (weights_only), as from a file."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
