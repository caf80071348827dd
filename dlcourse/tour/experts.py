"""The tour's expert-parallel row (lesson 09, `lessons/09_experts.ipynb`): the tour's GPT with a
mixture-of-experts MLP in every block (`MoEGPT`, E = 4 experts, top-2, dropless), its experts
dealt out over every rank of the job (ep = world size, E/ep experts each) and its dense weights
replicated: EP with DP on one group, each rank training on its slice of the global batch
(`dlcourse.parallel.expert.parallelize`). The tour's reference is a dense GPT, so rank 0 also
trains the same MoE GPT in one process and the row is compared with that. A world size that does
not divide E is refused by `check_ep` before any rank starts, and the tour names it.

Communication per step, exact: the all-to-alls of rows send only the rows bound for other ranks,
(M - own)·h and (R - own)·h values each way (`measure.py`), which `CommCounter`'s average bus
factor (ep-1)/ep gets right only when routing is uniform; so the row takes the rows each MoE
layer actually moved (`rows_moved`) and the counter's bus bytes for everything else (the counts
exchange, the all-gather of counts, the all-reduce of the dense gradients). The ranks route
different tokens, so they send different amounts; the table shows rank 0's, as for every row.
The activations a rank saves depend on how many rows its experts received: the table shows the
busiest rank's, as for every row.
"""

import dataclasses
import statistics
import time

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import peak_activations
from dlcourse.models import MoEConfig, MoEGPT, moe_loss
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.expert import average_gradients, check_ep, expert_parallel, full_parameters
from dlcourse.parallel.expert.compare import ep_step  # dense all-reduce / ep, experts / ep
from dlcourse.parallel.expert.measure import rows_moved
from dlcourse.tour.common import RowResult, cpu_params, held_bytes, mean_over_ranks

N_EXPERTS, TOP_K = 4, 2


def moe_config(cfg):
    """The tour's GPT with E = 4 experts in every block, top-2, dropless, experts as wide as the
    dense MLP (4h)."""
    return MoEConfig(**dataclasses.asdict(cfg.model), n_experts=N_EXPERTS, top_k=TOP_K)


def new_moe_model(cfg, config):
    """The MoE GPT as the row and its reference start it: same seed, on this process's device."""
    return MoEGPT(config, seed=cfg.seed).to(cfg.device())


def check_ep_row(cfg, world_size):
    """Before any rank starts: ep = world_size must divide the E experts. On nccl the row runs
    as on gloo: every tensor of the expert-parallel path follows its input's device."""
    check_ep(moe_config(cfg), world_size)


def sent_bytes(comm, model, group):
    """Bytes this rank put on its link in one counted step: every row all-to-all as the rows
    that left the rank, forward and backward (4 per MoE layer); the counts all-to-all (E int64,
    E/ep to each rank: (ep-1)/ep of them leave); the rest as the counter's bus bytes."""
    ep = dist.get_world_size(group)
    total = sum(r.bus_bytes() for r in comm.records if r.op != "all_to_all")
    for moe in model.moe_layers():
        moved = rows_moved(moe, group)
        h = moe.router.weight.size(1)
        # forward: dispatch sends M - own rows, combine R - own; backward: the same two, reversed
        rows = 2 * (moved["dispatch"] - moved["own"] + moved["combine"] - moved["own"])
        total += rows * h * moe.router.weight.element_size()
        total += moe.n_experts * 8 * (ep - 1) / ep  # the counts exchange
    return total


def train_ep_row(cfg):
    """cfg.steps AdamW steps of the MoE GPT, expert-parallel over every rank of the job; one more
    step on a fresh copy is counted apart (bytes, activations). Rank 0 also brings the
    one-process run."""
    group, config = dist.group.WORLD, moe_config(cfg)
    x, y = shard_batch(cfg.data(), group)  # (global_batch / ep, s) each
    model = expert_parallel(new_moe_model(cfg, config), group)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    times, loss = [], None
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = ep_step(model, optimizer, x, y, group)
        if cfg.cuda:
            torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before the clock
        times.append(time.perf_counter() - start)
    fresh = expert_parallel(new_moe_model(cfg, config), group)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=cfg.lr)
    with CommCounter() as comm:  # and lesson 01's saved-tensor log: the most activations held
        _, activations = peak_activations(
            fresh, lambda: ep_step(fresh, fresh_optimizer, x, y, group), ignore=(x, y))
    params = {k: v.to("cpu", copy=True) for k, v in full_parameters(model, group).items()}
    result = RowResult(mean_over_ranks(loss.item(), cfg), params, held_bytes(model, optimizer),
                       round(sent_bytes(comm, fresh, group)), statistics.median(times), activations)
    if dist.get_rank() == 0:  # the row's result is rank 0's; its reference is the MoE GPT's
        result.reference = train_moe_reference(cfg, config)
    return result


def train_moe_reference(cfg, config):
    """The same MoE GPT in one process on the whole global batch: its parameters."""
    model = new_moe_model(cfg, config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    x, y = cfg.data()
    for _ in range(cfg.steps):
        loss = moe_loss(model, model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return cpu_params(model)
