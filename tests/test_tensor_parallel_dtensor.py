"""Lesson 04's torch API on real gloo ranks: the course GPT made tensor-parallel by DTensor's
`parallelize_module` (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput)
and trained with `loss_parallel` equals the from-scratch version and the single process; and
torch's `CommDebugMode` counts the same collectives as the course's `CommCounter`.

Tolerance: float64 AdamW, as in test_tensor_parallel_gpt.py (measured at most 3e-14 after 3
steps there; 1e-11 allowed).
"""

from functools import partial

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode

import dlcourse
from dlcourse.collectives.counter import CommCounter
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.tensor import full_parameters, parallelize, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.dtensor import (dtensor_full_parameters, loss_parallel,
                                              parallelize_dtensor)

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16)
BATCH, STEPS, LR, TOL = 4, 3, 1e-3, 1e-11


def dtensor_loss(logits, targets):
    with loss_parallel():  # cross-entropy on logits sharded by vocabulary, never gathered
        return lm_loss(logits, targets)


def train(model, loss_fn, data):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(model(data[0]), data[1])
        with loss_parallel():  # backward through the parallel loss runs under it too
            loss.backward()
        optimizer.step()


def trained(mesh, sequence_parallel):
    """(reference, from scratch, DTensor) whole weights after STEPS, float64."""
    group = mesh.get_group()
    data = synthetic_tokens(BATCH, CFG, seed=1)
    reference = GPT(CFG, seed=0)
    train(reference, lm_loss, data)
    scratch = parallelize(GPT(CFG, seed=0), group, sequence_parallel)
    train(scratch, partial(vocab_parallel_lm_loss, group=group), data)
    model = parallelize_dtensor(GPT(CFG, seed=0), mesh, sequence_parallel)
    train(model, dtensor_loss, data)
    return ({n: p.detach() for n, p in reference.named_parameters()},
            full_parameters(scratch, group), dtensor_full_parameters(model))


def counted(mesh, sequence_parallel):
    """One forward and backward of the DTensor model seen by both counters, and the from-scratch
    model's by ours: (CommDebugMode calls by op, CommCounter by_op, from-scratch by_op)."""
    group = mesh.get_group()
    x, y = synthetic_tokens(BATCH, CFG, seed=1)
    model = parallelize_dtensor(GPT(CFG, seed=0), mesh, sequence_parallel)
    with CommDebugMode() as torch_count, CommCounter() as ours:
        loss = dtensor_loss(model(x), y)
        with loss_parallel():
            loss.backward()
    scratch = parallelize(GPT(CFG, seed=0), group, sequence_parallel)
    with CommCounter() as scratch_count:
        vocab_parallel_lm_loss(scratch(x), y, group).backward()
    torch_calls = {op.__name__.removesuffix("_into_tensor").removesuffix("_tensor"): n
                   for op, n in torch_count.get_comm_counts().items()}
    return torch_calls, ours.by_op(), scratch_count.by_op()


def everything():
    meshes = {4: init_device_mesh("cpu", (4,)),
              2: init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]}
    out = {}
    for tp, mesh in meshes.items():
        for sp in (False, True):
            out["count", tp, sp] = counted(mesh, sp)
    torch.set_default_dtype(torch.float64)
    for tp, mesh in meshes.items():
        for sp in (False, True):
            out["train", tp, sp] = trained(mesh, sp)
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(everything, world_size=4, backend="gloo")


TP_SP = [(tp, sp) for tp in (2, 4) for sp in (False, True)]


def max_error(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("tp, sp", TP_SP)
def test_dtensor_tp_equals_from_scratch_and_one_process(results, tp, sp):
    for rank, out in enumerate(results):
        reference, scratch, dtensor = out["train", tp, sp]
        assert max_error(dtensor, scratch) <= TOL, f"rank {rank}: DTensor vs from scratch"
        assert max_error(dtensor, reference) <= TOL, f"rank {rank}: DTensor vs one process"


@pytest.mark.parametrize("tp, sp", TP_SP)
def test_comm_debug_mode_and_comm_counter_agree(results, tp, sp):
    for out in results:
        torch_calls, ours, _ = out["count", tp, sp]
        assert torch_calls == {op: calls for op, (calls, _, _) in ours.items()}


@pytest.mark.parametrize("tp", [2, 4])
def test_dtensor_tp_moves_the_same_bytes_as_from_scratch(results, tp):
    for out in results:
        _, dtensor, scratch = out["count", tp, False]
        assert dtensor == scratch  # {op: (calls, bytes, bus bytes)}
