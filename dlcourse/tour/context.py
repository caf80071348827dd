"""The tour's context-parallel rows (lesson 08, `lessons/08_context_parallel.ipynb`): the course
GPT made context-parallel over every rank of the job (cp = world size) with each of
`dlcourse.parallel.context.METHODS`. Every rank trains on the whole global batch, but only its
s/cp tokens of each sequence (zig-zag chunks for the zig-zag ring); the weights are replicated,
so the gradients are averaged over the group as in data parallelism. A method the world size
cannot split (Ulysses needs cp to divide the heads; the layouts need cp, or 2·cp, to divide the
sequence) is refused by `check_cp` before any rank starts, and the tour names it with the reason.
"""

import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import peak_activations
from dlcourse.models import lm_loss
from dlcourse.parallel.context import average_gradients, check_cp, context_parallel, cp_layout
from dlcourse.tour.common import RowResult, cpu_params, held_bytes, mean_over_ranks

METHOD_ROWS = {  # row name -> context-parallel method
    "CP ring (lesson 08)": "ring",
    "CP zig-zag ring (lesson 08)": "zigzag",
    "CP Ulysses (lesson 08)": "ulysses",
    "CP all-gather KV (lesson 08)": "allgather",
}


def check_cp_row(method, cfg, world_size):
    """Before any rank starts: cp = world_size must split the tour's sequence (and heads)."""
    check_cp(cfg.model, world_size, method)


def cp_step(model, optimizer, x, y, group):
    """One AdamW step on this rank's tokens; the loss of its s/cp tokens."""
    loss = lm_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    average_gradients(model, group)  # each rank's gradient is of its tokens' mean loss
    optimizer.step()
    return loss


def train_cp_row(method, cfg):
    """cfg.steps AdamW steps of the course GPT made context-parallel with `method` over every
    rank of the job; one more step on a fresh copy is counted apart (bytes, activations)."""
    group = dist.group.WORLD
    layout = cp_layout(cfg.model, group, method)
    rank = dist.get_rank(group)
    x, y = (layout.shard(t, rank) for t in cfg.data())  # (global_batch, s/cp) each
    model = context_parallel(cfg.new_model(), group, method).to(cfg.device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    times, loss = [], None
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = cp_step(model, optimizer, x, y, group)
        if cfg.cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    fresh = context_parallel(cfg.new_model(), group, method).to(cfg.device())
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=cfg.lr)
    with CommCounter() as comm:
        _, activations = peak_activations(
            fresh, lambda: cp_step(fresh, fresh_optimizer, x, y, group), ignore=(x, y))
    # every rank holds as many tokens: the mean of the ranks' losses is the whole batch's
    return RowResult(mean_over_ranks(loss.item(), cfg), cpu_params(model),
                     held_bytes(model, optimizer), round(comm.bus_bytes()),
                     statistics.median(times), activations)
