"""The same with torch: `torch.distributed.checkpoint` (DCP) on FSDP2 and DTensor TP, loaded under
another mesh, and `async_save` (lesson 11, `lessons/11_checkpoints.ipynb`).

    model_sd, optim_sd = get_state_dict(model, optimizer)       # DTensors: each rank's shards
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    dcp.load(state, checkpoint_id=path)                         # in place, resharded by DCP
    set_state_dict(model, optimizer, model_state_dict=..., optim_state_dict=...)

DCP is what the course built in `sharded.py`: every rank writes its chunks, `.metadata` lists each
chunk's offsets and sizes (written last, by the coordinator: `files.py`), and a load intersects
the chunks a rank wants with the saved ones. `get_state_dict` of an optimizer that has not
stepped makes its state first, with one step on zero gradients (torch 2.13,
distributed/checkpoint/state_dict.py `_init_optim_state`), so the load has tensors to fill.
"""

import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from dlcourse.models import GPT, lm_loss, synthetic_tokens
from dlcourse.parallel.tensor.compare import step as tp_step
from dlcourse.parallel.tensor.dtensor import dtensor_full_parameters, parallelize_dtensor
from dlcourse.parallel.zero.torch_api import fsdp2, fsdp2_full_parameters


def _whole(t):
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def optimizer_moments(optimizer, model):
    """{"exp_avg/<name>": whole tensor, ...} of AdamW's moments (DTensors gathered)."""
    names = {p: n for n, p in model.named_parameters()}
    return {f"{k}/{names[p]}": _whole(s[k]) for p, s in optimizer.state.items()
            for k in ("exp_avg", "exp_avg_sq")}


def build(kind, cfg, seed):
    """(model, optimizer, step fn(x, y), whole-parameters fn) of `kind` on every rank:
    "fsdp2" (FSDP2 over every rank) or "tp" (DTensor TP on a 1-D mesh of every rank) or
    "dp_tp" (DTensor TP on the tp axis of a (2, world/2) mesh: another mesh than "tp"'s)."""
    plain = GPT(cfg.model, seed=seed).double()
    if kind == "fsdp2":
        model, optimizer = fsdp2(plain, dist.group.WORLD, lr=1e-2)

        def step(x, y):
            optimizer.zero_grad()
            lm_loss(model(x), y).backward()
            optimizer.step()
        return model, optimizer, step, lambda: fsdp2_full_parameters(model)
    if kind in ("tp", "dp_tp"):
        ws = dist.get_world_size()
        mesh = init_device_mesh("cpu", (ws,)) if kind == "tp" else \
            init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("dp", "tp"))["tp"]
        model = parallelize_dtensor(plain, mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        def step(x, y):  # lesson 04's DTensor step: the loss under loss_parallel
            tp_step(model, optimizer, lm_loss, x, y)
        return model, optimizer, step, lambda: dtensor_full_parameters(model)
    raise ValueError(f"kind is 'fsdp2', 'tp' or 'dp_tp', got {kind!r}")


def dcp_save_job(path, kind, cfg):
    """On every rank: train `kind` cfg.steps steps, dcp.save it; returns the whole parameters and
    AdamW moments, as the strategy's own gathers give them."""
    model, optimizer, step, whole = build(kind, cfg, cfg.seed)
    x, y = synthetic_tokens(cfg.batch, cfg.model, seed=cfg.seed)
    for _ in range(cfg.steps):
        step(x, y)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    return whole(), optimizer_moments(optimizer, model)


def dcp_load_job(path, kind, cfg):
    """On every rank: a fresh `kind` (other weights: seed + 1) loads `path`, saved under any
    mesh; returns its whole parameters and moments."""
    model, optimizer, _, whole = build(kind, cfg, cfg.seed + 1)
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the shapes and shards to fill
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return whole(), optimizer_moments(optimizer, model)


def async_timing_job(root, cfg, rounds=3):
    """On every rank: seconds the training loop is blocked by dcp.save, and by dcp.async_save
    (staging to CPU memory, then a thread writes), and the seconds until async_save's write is
    done; medians over `rounds`, side by side in one job."""
    model, optimizer, step, _ = build("fsdp2", cfg, cfg.seed)
    x, y = synthetic_tokens(cfg.batch, cfg.model, seed=cfg.seed)
    step(x, y)
    # async_save's thread runs DCP's collectives while the next step runs the model's: on the
    # same gloo group the two streams of collectives interleave and the job hangs (measured), so
    # the checkpoint gets a group of its own (async_save(..., process_group=))
    ckpt_group = dist.new_group(backend="gloo")
    blocked_sync, blocked_async, finished_async = [], [], []
    for i in range(rounds):
        state = dict(zip(("model", "optim"), get_state_dict(model, optimizer)))
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{root}/sync_{i}")
        blocked_sync.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=f"{root}/async_{i}", process_group=ckpt_group)
        blocked_async.append(time.perf_counter() - t0)
        step(x, y)  # the next step runs while the thread writes
        future.result()
        finished_async.append(time.perf_counter() - t0)
        dist.barrier()
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return med(blocked_sync), med(blocked_async), med(finished_async)
