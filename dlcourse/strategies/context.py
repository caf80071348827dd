"""Lesson 08's context parallelism in the catalogue (`lessons/08_context_parallel.ipynb`): the
course GPT made context-parallel over the cp group with each of `parallel.context.METHODS`.
Every rank trains on the whole global batch, but only its s/cp tokens of each sequence
(`cp_layout`: contiguous or zig-zag chunks); the weights are replicated, so the gradients are
averaged over the group as in data parallelism."""

import torch

from dlcourse.models import lm_loss
from dlcourse.parallel.context import average_gradients, context_parallel, cp_layout
from dlcourse.strategies.trainer import Trainer, count_step, replica_parameters

METHODS = {  # catalogue name -> context-parallel method
    "CP ring (lesson 08)": "ring",
    "CP zig-zag ring (lesson 08)": "zigzag",
    "CP Ulysses (lesson 08)": "ulysses",
    "CP all-gather KV (lesson 08)": "allgather",
}


def cp_step(model, optimizer, x, y, group):
    """One AdamW step on this rank's tokens; the loss of its s/cp tokens."""
    loss = lm_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    average_gradients(model, group)  # each rank's gradient is of its tokens' mean loss
    optimizer.step()
    return loss


def build(method, cfg, groups):
    """`context_parallel(method)` over the cp group; each step on this rank's tokens."""
    group, rank = groups.cp, groups.coords["cp"]
    layout = cp_layout(cfg.model, group, method)
    model = context_parallel(cfg.new_model(), group, method).to(cfg.device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):  # (global_batch, s/cp) each
        return cp_step(model, optimizer, *(layout.shard(t, rank) for t in (x, y)), group).item()

    def piece(ref):  # this rank's tokens: dim 1 of (B, s, ...), dim 0 of the positions (s, h)
        s = cfg.model.seq_len
        dim = 1 if ref.dim() > 2 and ref.size(1) == s else 0 if ref.size(0) == s else None
        return None if dim is None else layout.shard(ref, rank, dim=dim)

    def count(trainer, x, y):  # the step on this rank's tokens, which are not counted
        x, y = (layout.shard(t, rank) for t in (x, y))
        return count_step(trainer, x, y, run=lambda: cp_step(model, optimizer, x, y, group))
    return Trainer([model], optimizer, train_step, replica_parameters(model), count=count,
                   piece=piece)
