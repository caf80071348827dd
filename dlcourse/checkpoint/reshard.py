"""Save in one layout, load in another, on real ranks (lesson 11, `lessons/11_checkpoints.ipynb`).

    save_job(root, "zero3", cfg)   on 4 ranks: train ZeRO-3, save, return the whole state
    load_job(path, cfg)            on 2 ranks: a fresh ZeRO-3 model loads it, returns its whole state
    save_job(root, "dp_tp", cfg)   on 4 ranks: lesson 07's DP x TP 2 x 2 grid, saved the same way

The whole state each side returns is gathered by the strategy's own collectives (an all-gather of
ZeRO's shards, lesson 04's `unshard` over tp), not by the checkpoint code, so the comparison of the
two checks the reshard.
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlcourse.checkpoint.sharded import STATE, load_pieces, save_sharded, tp_pieces, zero3_pieces
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.combine import GridPlan, combine
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor.layers import unshard
from dlcourse.parallel.zero import ZeroAdamW, ZeroStage3


@dataclass
class ShardConfig:
    # small, and with sizes that do not divide evenly: Ψ per unit is not a multiple of 4 or 3
    model: GPTConfig = field(default_factory=lambda: GPTConfig(
        vocab_size=36, seq_len=8, n_layers=2, n_heads=2, hidden=12))
    batch: int = 4  # sequences per step
    steps: int = 2  # steps trained before the save (so AdamW's moments are not zeros)
    seed: int = 0


def zero3_trainer(cfg, group, seed=None):
    model = GPT(cfg.model, seed=cfg.seed if seed is None else seed).double()
    model = ZeroStage3(model, group)
    return model, ZeroAdamW(model, lr=1e-2)


def _train(step_fn, cfg):
    x, y = synthetic_tokens(cfg.batch * cfg.steps, cfg.model, seed=cfg.seed)
    for i in range(cfg.steps):
        step_fn(x[i * cfg.batch:(i + 1) * cfg.batch], y[i * cfg.batch:(i + 1) * cfg.batch])


def _zero3_step(model, optimizer, group):
    def step(x, y):
        x, y = x.tensor_split(dist.get_world_size(group))[dist.get_rank(group)], \
            y.tensor_split(dist.get_world_size(group))[dist.get_rank(group)]
        optimizer.zero_grad()
        lm_loss(model(x), y).backward()
        optimizer.step()
    return step


@torch.no_grad()
def zero3_whole_state(model, optimizer):
    """{"param/<name>": whole tensor, "exp_avg/...", "exp_avg_sq/..."}: every unit's shards
    all-gathered (ZeRO-3's own collective) and cut into the unit's parameters."""
    out = {}
    for unit, shard in zip(model.units, model.shards()):
        state = optimizer.inner.state[shard]
        for kind, flat in (("param", shard), ("exp_avg", state["exp_avg"]),
                           ("exp_avg_sq", state["exp_avg_sq"])):
            whole = torch.empty(unit.padded, dtype=flat.dtype)
            dist.all_gather_single(whole, flat.detach().contiguous(), group=model.group)
            out.update({f"{kind}/{n}": v.clone() for n, v in zip(unit.names, unit.views(whole))})
    return out


@torch.no_grad()
def tp_whole_state(model, optimizer, tp_group):
    """The same for a tensor-parallel model: each sharded tensor all-gathered over tp and put
    back together by lesson 04's `unshard`."""
    out = {}
    for name, p in model.named_parameters():
        st = optimizer.state[p]
        for kind, v in (("param", p), ("exp_avg", st["exp_avg"]), ("exp_avg_sq", st["exp_avg_sq"])):
            if hasattr(p, "tp_dim"):
                parts = [torch.empty_like(v) for _ in range(dist.get_world_size(tp_group))]
                dist.all_gather(parts, v.detach().contiguous(), group=tp_group)
                v = unshard(parts, p.tp_dim, p.tp_parts)
            out[f"{kind}/{name}"] = v.detach().clone()
    return out


def save_job(root, layout, cfg, step=1):
    """On every rank: train `layout` ("zero3": ZeRO-3 over all ranks; "dp_tp": DP x TP 2 x 2), save
    it sharded; returns (path, bytes this rank wrote, the whole state)."""
    group = dist.group.WORLD
    if layout == "zero3":
        model, optimizer = zero3_trainer(cfg, group)
        _train(_zero3_step(model, optimizer, group), cfg)
        pieces, whole = zero3_pieces(model, optimizer), zero3_whole_state(model, optimizer)
    elif layout == "dp_tp":
        plan = GridPlan(RankGrid(dp=2, tp=2))
        groups = plan.grid.new_groups()
        trainer = combine(GPT(cfg.model, seed=cfg.seed).double(), plan, groups, lr=1e-2)
        _train(trainer.train_step, cfg)
        model, optimizer = trainer.modules[0], trainer.optimizer
        first_replica = dist.get_rank(groups.dp) == 0  # the dp replicas hold the same: one saves
        pieces = tp_pieces(model, optimizer, groups.tp,
                           save_replicated=dist.get_rank(groups.tp) == 0) if first_replica else []
        whole = tp_whole_state(model, optimizer, groups.tp)
    else:
        raise ValueError(f"layout is 'zero3' or 'dp_tp', got {layout!r}")
    path, wrote = save_sharded(root, step, pieces, group)
    return path, wrote, whole


def load_job(path, cfg):
    """On every rank: a fresh ZeRO-3 model (other weights: seed + 1) loads `path`, whatever layout
    saved it; returns (bytes this rank read, the whole state, its AdamW step count)."""
    model, optimizer = zero3_trainer(cfg, dist.group.WORLD, seed=cfg.seed + 1)
    read = load_pieces(path, zero3_pieces(model, optimizer))
    step = optimizer.inner.state[model.shards()[0]]["step"].item()
    return read, zero3_whole_state(model, optimizer), step


def n_params(cfg):
    return sum(p.numel() for p in GPT(cfg.model).parameters())


__all__ = ["STATE", "ShardConfig", "load_job", "n_params", "save_job", "tp_whole_state",
           "zero3_trainer", "zero3_whole_state"]
