"""The rank side of lesson 05's checks: what runs in each rank while a student's function runs
there. It imports none of the lesson's code (`dlcourse.parallel.zero`) and holds no reference:
under `dlcourse grade` this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`,
`grading/absent.py`). The rank builds the model the case names; the shards it starts from (its
master shard, its piece of a stage-3 unit) are cut in the checking process and handed to it as
data, and the reference runs (one process on the whole batch, the unsharded gradients) are
computed there too (`zero_step.py`, `gather_and_free.py`).
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.collectives.counter import CommCounter
from dlcourse.memory import storage_bytes
from dlcourse.models import GPT, MLP, lm_loss

MODEL_SEED = 5
# eps = 1e-3, not 1e-8: with a tiny eps Adam's step hardly depends on the gradient's size
# (m / sqrt(v)), so a gradient summed instead of averaged would move weights by ~1e-11 only.
ADAMW = {"lr": 1e-2, "eps": 1e-3, "weight_decay": 0.01}


# ---------------------------------------------------------------- what a rank builds

def build(spec):
    """The case's model ("MLP" or "GPT", config), float64, the same weights in every process."""
    kind, config = spec
    return (MLP if kind == "MLP" else GPT)(config, MODEL_SEED).to(torch.float64)


def loss_fn(spec):
    return F.mse_loss if spec[0] == "MLP" else lm_loss


def flat_of(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def unit_of(model, spec):
    """The unit stage 3 shards: the GPT's last block, or the MLP's output layer."""
    return model.blocks[-1] if spec[0] == "GPT" else model[-1]


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------- exercise 1: the shard

def shard_in_rank(shard_of, params):
    """Runs in every rank: the parameters as nn.Parameters, the student's shard of them."""
    params = [nn.Parameter(p.clone()) for p in params]
    got = shard_of(params, dist.group.WORLD)
    got = got.detach().clone() if isinstance(got, torch.Tensor) else got
    return got, [p.detach() for p in params]


# ---------------------------------------------------------------- exercise 2: the step

def step_in_rank(spec, masters, zero_step, steps):
    """Runs in every rank: the model, this rank's master shard and its AdamW, then for each
    step a backward on this rank's samples and the student's step, recorded. `masters[r]`: rank
    r's shard of the model's flat parameters, padded (cut in the checking process)."""
    model = build(spec)
    params = list(model.parameters())
    W, rank = dist.get_world_size(), dist.get_rank()
    master = masters[rank].clone()
    master.requires_grad_(True)
    optimizer = torch.optim.AdamW([master], **ADAMW)
    records = []
    for x, y in steps:
        model.zero_grad(set_to_none=True)
        loss_fn(spec)(model(x), y).backward()
        with CommCounter() as comm:
            zero_step(params, master, optimizer, dist.group.WORLD)
        grad = master.grad
        records.append({"weights": snapshot(model), "master": master.detach().clone(),
                        "master_grad": None if grad is None else grad.detach().clone(),
                        "held": storage_bytes(p.grad for p in params if p.grad is not None),
                        "ops": [r.op for r in comm.records], "moved": _moved(comm.records),
                        "buffer": W * master.numel() * master.element_size()})
    return records


def _moved(records):
    """{collective: bytes} of a step (`CommRecord.nbytes`: reduce-scatter's whole input,
    all-gather's whole output)."""
    moved = {}
    for record in records:
        moved[record.op] = moved.get(record.op, 0) + record.nbytes
    return moved


# ---------------------------------------------------------------- exercise 3: a stage-3 unit

def unit_in_rank(spec, shards, student, micro_batches):
    """Runs in every rank: the unit's parameters made views of `full` (freed) with this rank's
    shard beside it (`shards[r]`, cut in the checking process), the student's hooks installed,
    then forward and backward, watched."""
    model = build(spec)
    unit = unit_of(model, spec)
    W, rank = dist.get_world_size(), dist.get_rank()
    full, shard = _shard_unit(unit, W, shards[rank].clone())
    records, loss_of = [], loss_fn(spec)  # the check's own helpers: called before the guard
    with student.guarded():  # the hooks run the student's code: guarded as it runs
        student.fn(unit, full, shard, dist.group.WORLD)
        for x, y in micro_batches:
            model.zero_grad(set_to_none=True)
            with CommCounter() as forward:
                loss = loss_of(model(x), y)
            after_forward = storage_bytes(unit.parameters())
            with CommCounter() as backward:
                loss.backward()
            records.append({"grads": {n: p.grad for n, p in model.named_parameters()},
                            "after_forward": after_forward,
                            "after_backward": storage_bytes(unit.parameters()),
                            "forward_ops": [(r.op, r.nbytes) for r in forward.records],
                            "backward_ops": [(r.op, r.nbytes) for r in backward.records]})
    return records


def _shard_unit(unit, W, shard):
    """Make every parameter of `unit` a view of one flat buffer `full` (N x s elements, padded),
    free it, and return (full, `shard`: this rank's s elements of it)."""
    params = list(unit.named_parameters())
    full = torch.zeros(W * shard.numel(), dtype=shard.dtype)
    offset = 0
    for name, p in params:
        owner, _, attr = name.rpartition(".")
        module = unit.get_submodule(owner) if owner else unit
        setattr(module, attr, nn.Parameter(full[offset:offset + p.numel()].view_as(p)))
        offset += p.numel()
    full.untyped_storage().resize_(0)  # stage 3: between passes a rank holds only its shard
    return full, shard
