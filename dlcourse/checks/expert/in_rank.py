"""The rank side of lesson 09's checks: what runs in a rank while a student's function runs
there. It imports none of the lesson's code and holds no reference: under `dlcourse grade`
this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`, `grading/absent.py`); the
references (`reference.py`) run in the checking process.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.core import kind
from dlcourse.collectives.counter import CommCounter


def dispatch_in_rank(student, x, experts, n_experts):
    """Runs in every rank: the student's dispatch on this rank's rows, and the bytes it sent."""
    with CommCounter() as comm:
        got = student(x.clone(), experts.clone(), n_experts, dist.group.WORLD)
    sent = sum(r.nbytes for r in comm.records if r.op in ("all_to_all", "send"))
    return got, sent


def loss_and_grad(value, logits, k):
    """`call_in_process(answer=...)`: the loss as a float and its gradient w.r.t. the logits,
    computed where the student's function ran, after it returned."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        return {"value": value, "grad": None, "why": kind(value)}
    grad = None
    if value.requires_grad:
        (grad,) = torch.autograd.grad(value.sum(), logits, allow_unused=True)
    return {"value": float(value.detach()), "grad": grad, "why": ""}
