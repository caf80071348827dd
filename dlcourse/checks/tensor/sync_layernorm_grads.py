"""Lesson 04, exercise 8 (`exercises/04_tensor_parallel.ipynb`): `check_layernorm_grads`,
sequence parallelism's LayerNorm gradients summed over the tp ranks, with one all-reduce of its
2h numbers, after the block's backward (`sequence_block.py`).
"""

import torch
import torch.distributed as dist

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail, run_on_ranks
from dlcourse.checks.core.cases import fresh_cases
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, torch_received
from dlcourse.checks.tensor.cases import draw_tp_sizes
from dlcourse.checks.tensor.in_rank import sync_in_rank
from dlcourse.checks.tensor.sequence_block import (SEQUENCE, TOL, TOLERANCE, draw_block,
                                                   own_ln_grads, reference)


SYNC_HINT = ("each rank's LayerNorm saw only its own tokens: all-reduce (sum) the .grad of its "
             "weight and bias over the group, in place")


@fresh_cases
def check_layernorm_grads(sync_layernorm_grads, timeout=CHECK_TIMEOUT_S, *, rng):
    """sync_layernorm_grads(layernorm, group), called after backward on every rank of the
    sequence-parallel block: each rank's LayerNorm .grad must then be the whole sequence's, with
    one all-reduce of its 2h numbers."""
    __tracebackhide__ = True
    expect_callable(sync_layernorm_grads, "sync_layernorm_grads")
    for tp in draw_tp_sizes(rng):
        # on 3 or 4 ranks an all-reduce receives less than gathering every rank's gradients
        # (on 2 as much): there 2h numbers of 4 WIRE_FLOOR bytes or more, h >= 512 (measured:
        # such a gather stood ~1 KB above the ceiling at h = 256 on 4 ranks, ~2 KB at 512 on 3)
        x, ln, a, b, upstream = draw_block(rng, tp, h_least=WIRE_FLOOR // 4 if tp > 2 else 0)
        where = (f"sync_layernorm_grads on {tp} ranks, LayerNorm({x.shape[-1]}), x "
                 f"{tuple(x.shape)} cut along dim 1")
        ln_state = (ln.weight.detach().clone(), ln.bias.detach().clone())
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(sync_layernorm_grads,  # rank r: its tokens' share only
                                [(ln_state, own) for own in own_ln_grads(x, ln, a, b, upstream,
                                                                         tp)],
                                exercise="sync_layernorm_grads", where=where, hint=SYNC_HINT,
                                harness=sync_in_rank, guard=SEQUENCE.in_rank, timeout=timeout,
                                received=received)
        _, _, grads = reference(x, ln, a, b, upstream)
        for rank, (got, _) in enumerate(outcomes):
            _expect_synced(got, rank, tp, grads, ln, where)
        _expect_sync_received(received, ln, tp, where)
    print("sync_layernorm_grads: passed on 3 cases drawn afresh (2, 3 and 4 ranks): "
          "every rank's LayerNorm gradients equal one process's on the whole sequence, one "
          "all-reduce of 2h numbers")


def _expect_sync_received(received, ln, tp, where):
    """What each rank received, counted outside it: no more than torch's own all-reduce of the
    2h gradients receives (as one tensor or two) and HEADER_ROOM a peer; no less than the
    (t - 1)/t of them that any all-reduce brings a rank."""
    __tracebackhide__ = True
    grads = torch.zeros(2, ln.weight.numel(), dtype=torch.float64)  # (2, h): weight, bias
    most = torch_received(_sync_messages, [(grads,)] * tp, ways=("one", "two"))
    least = (tp - 1) * grads.numel() * grads.element_size() // tp
    expect_received_data(received, most, where, SYNC_HINT, least=[least] * tp)


def _sync_messages(grads, way):
    """torch's own all-reduce of a rank's LayerNorm gradients (2, h): one, or one a row."""
    for part in ([grads] if way == "one" else list(grads)):
        dist.all_reduce(part)


def _expect_synced(got, rank, tp, grads, ln, where):
    __tracebackhide__ = True
    for name in ("weight", "bias"):
        want, own = grads[f"ln.{name}"], got["own"][name]
        hint = SYNC_HINT
        if isinstance(got[name], torch.Tensor) and torch.allclose(got[name], own, **TOL):
            hint = ("unchanged since backward: only this rank's tokens are in it, so the tp "
                    "ranks' copies of one LayerNorm get different gradients (the symptom "
                    "Megatron-LM issue #1446 reports). " + SYNC_HINT)
        elif isinstance(got[name], torch.Tensor) and torch.allclose(got[name], want / tp, **TOL):
            hint = "averaged: each rank's part is a sum over its tokens, so sum the parts"
        expect_tensor(got[name], want, where=f"{where}: LayerNorm {name}.grad", rank=rank,
                      tolerance=TOLERANCE, hint=hint, **TOL)
    if not (torch.equal(got["params"][0], ln.weight.detach())
            and torch.equal(got["params"][1], ln.bias.detach())):
        fail(where, rank, "changed the LayerNorm's parameters: sync their gradients only",
             SYNC_HINT)
    moved = [(op, n) for op, n in got["collectives"]]
    size = 2 * ln.weight.numel() * ln.weight.element_size()
    if any(op != "all_reduce" for op, _ in moved) or sum(n for _, n in moved) != size:
        said = ", ".join(f"{op} {n} bytes" for op, n in moved) or "nothing"
        fail(where, rank, f"moved {said}; the LayerNorm's gradients need an all-reduce of its "
                          f"2h numbers, {size} bytes, nothing more", SYNC_HINT)
