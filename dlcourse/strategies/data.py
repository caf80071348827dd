"""Lesson 03's data parallelism in the catalogue (`lessons/03_data_parallel.ipynb`): the naive,
bucketed and overlapped `DataParallel` and torch DDP (`parallel.data.compare.wrap`) on the dp
group, trained by lesson 03's accumulating `train_step` on this rank's slice of the batch."""

import torch

from dlcourse.models import lm_loss
from dlcourse.parallel.data import steps
from dlcourse.parallel.data.compare import count_step, wrap
from dlcourse.parallel.tensor.activations import measure_activations
from dlcourse.strategies.trainer import Trainer, rank_of, replica_parameters


def build(variant, cfg, groups):
    """`wrap(variant)` over the dp group: this rank's shard (uneven allowed, weighted by
    `uneven_loss_scale`), cut into cfg.micro_batches pieces that accumulate under `no_sync`."""
    group = groups.dp
    model = wrap(variant, cfg.new_model(), group, cfg.bucket_cap_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):
        x, y = steps.shard_batch((x, y), group, allow_uneven=True)  # (B/N, T) each
        micro = list(zip(x.chunk(cfg.micro_batches), y.chunk(cfg.micro_batches)))
        scale = steps.uneven_loss_scale(x.size(0), group)  # 1 for an even split
        return steps.train_step(model, optimizer, micro, lm_loss, loss_scale=scale)

    def count(trainer, x, y):
        """Counted apart on fresh replicas (`count_step`: DDP's buckets settle in step 2); a
        replica saves what the plain model saves on this rank's shard (the wrappers' hooks save
        nothing), counted on a plain copy."""
        batch = steps.shard_batch((x, y), group)
        comm = count_step(variant, cfg.new_model(), batch, lm_loss, group, cfg.bucket_cap_mb)
        activations, _ = measure_activations(cfg.new_model(), *batch, lm_loss)
        return round(comm.bus_bytes()), activations
    # every rank holds a whole replica: its own, to compare rank by rank
    return Trainer([model.module], optimizer, train_step, replica_parameters(model.module),
                   count=count, dp=rank_of(group), model=model)
