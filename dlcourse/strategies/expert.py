"""Lesson 09's expert parallelism in the catalogue (`lessons/09_experts.ipynb`): the course GPT
with a mixture-of-experts MLP in every block (`MoEGPT`, E = 4 experts, top-2, dropless), its
experts dealt out over the dp group (ep = dp, E/ep experts each) and its dense weights
replicated: EP with DP on one group, each rank training on its slice of the global batch
(`parallel.expert.expert_parallel`). Its reference is the same MoE GPT in one process.

Communication per step, exact: the all-to-alls of rows send only the rows bound for other ranks,
(M - own)·h and (R - own)·h values each way (`parallel/expert/measure.py`), which `CommCounter`'s
average bus factor (ep-1)/ep gets right only when routing is uniform; so `sent_bytes` takes the
rows each MoE layer actually moved (`rows_moved`) and the counter's bus bytes for everything
else (the counts exchange, the all-gather of counts, the all-reduce of the dense gradients). The
ranks route different tokens, so they send different amounts.
"""

import dataclasses
from functools import partial

import torch
import torch.distributed as dist

from dlcourse.models import MoEConfig, MoEGPT
from dlcourse.parallel.data import steps
from dlcourse.parallel.expert import check_ep, expert_parallel, full_parameters
from dlcourse.parallel.expert.compare import ep_step  # dense all-reduce / ep, experts / ep
from dlcourse.parallel.expert.measure import rows_moved
from dlcourse.parallel.grid import RankGrid
from dlcourse.strategies.trainer import Trainer, count_step, rank_of

N_EXPERTS, TOP_K = 4, 2


def moe_config(cfg):
    """cfg's GPT with E = 4 experts in every block, top-2, dropless, experts as wide as the
    dense MLP (4h)."""
    return MoEConfig(**dataclasses.asdict(cfg.model), n_experts=N_EXPERTS, top_k=TOP_K)


def moe_model(cfg, dtype=None):
    """The MoE GPT as the strategy and its reference start it: same seed, cfg.dtype (or `dtype`)."""
    return MoEGPT(moe_config(cfg), seed=cfg.seed).to(cfg.device(), dtype or cfg.dtype)


def ep_grid(cfg, world_size):
    """ep = dp = world_size must divide the E experts. On nccl it runs as on gloo: every tensor
    of the expert-parallel path follows its input's device."""
    check_ep(moe_config(cfg), world_size)
    return RankGrid(dp=world_size)


def build(cfg, groups):
    """The MoE GPT, E/ep experts per rank and the dense weights replicated, each rank on its
    slice of the batch; `expert.full_parameters` gathers the experts."""
    group = groups.dp
    # cut in float32, then cast: GroupedLinear.narrow builds its block in the default dtype
    model = expert_parallel(moe_model(cfg, torch.float32), group).to(cfg.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    def train_step(x, y):  # (global_batch / ep, s) each
        return ep_step(model, optimizer, *steps.shard_batch((x, y), group), group).item()
    return Trainer([model], optimizer, train_step, partial(full_parameters, model, group),
                   count=partial(count_step, sent=partial(sent_bytes, model=model, group=group)),
                   dp=rank_of(group))


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
