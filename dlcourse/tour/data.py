"""The tour's data-parallel rows (lesson 03): lesson 03's three variants and torch DDP, each
wrapped with `dlcourse.parallel.data.compare.wrap` and counted with its `count_step`."""

import torch
import torch.distributed as dist

from dlcourse.models import lm_loss
from dlcourse.parallel.data.compare import count_step, wrap
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.tensor.activations import measure_activations
from dlcourse.tour.common import RowResult, cpu_params, held_bytes, mean_over_ranks, timed_steps


def train_dp_row(variant, cfg):
    """cfg.steps AdamW steps of the course GPT wrapped as `variant`, on every rank of the job;
    the bytes per step are counted apart, on a fresh replica (`count_step`), so that counting
    does not slow the timed steps."""
    group = dist.group.WORLD
    model = wrap(variant, cfg.new_model(), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    batch = shard_batch(cfg.data(), group)  # this rank's contiguous slice of the global batch
    loss, step_time = timed_steps(cfg, model, optimizer, *batch)
    comm = count_step(variant, cfg.new_model(), batch, lm_loss, group)
    # A replica saves what the plain model saves on this rank's shard: the wrappers' gradient
    # hooks save nothing. Counted on a plain copy, so that the timed steps run unwatched.
    activations, _ = measure_activations(cfg.new_model(), *batch, lm_loss)
    return RowResult(mean_over_ranks(loss, cfg), cpu_params(model.module),
                     held_bytes(model.module, optimizer), round(comm.bus_bytes()), step_time,
                     activations)
