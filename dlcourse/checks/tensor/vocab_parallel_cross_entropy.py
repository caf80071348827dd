"""Lesson 04's check of the vocabulary-parallel loss (`__init__.py` exports it):

    check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy)
                                     the loss and its gradient, the logits never gathered

The reference is single-process torch in float64: `F.cross_entropy` of the whole logits. Cases
(2, 3 and 4 ranks, sizes, values) are drawn afresh on every run (`core.fresh_cases`) from a seed
that a failure prints; `seed=` replays it. What each rank received is counted by the kernel,
outside it, and bounded by what torch's own all-reduces of a few numbers a token receive
(`core.received`), on 3 and 4 ranks with 8 KiB or more of logits a rank: logits gathered, with
the counter's records cleared, fail.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail,
                                  fresh_cases, random_tensor, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received, wire_floor_units
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import draw_tp_sizes, wide_seed
from dlcourse.checks.tensor.in_rank import loss_in_rank
from dlcourse.checks.tensor.layers import TOL, TOLERANCE, capital, close

# The linear checks' float64 tolerance, 1e-10: here one process and the ranks add the same ~100
# products in another order, ~1e-14 apart, 10^4 times less. Each mistake named here moves values
# by 0.01 or more.


# ---------------------------------------------------------------- exercise 6: the loss

LOSS_HINT = ("take m, the max of the logits over the whole vocabulary (all-reduce MAX of each "
             "row's max, no gradient); the sum of exp(logit - m) and the target's logit - m (0 "
             "on the ranks that do not hold the target) each summed over the ranks with your g "
             "(MegatronG.apply); loss = mean(log(sum) - target's (logit - m))")


@fresh_cases
def check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, timeout=CHECK_TIMEOUT_S, *,
                                       rng):
    """vocab_parallel_cross_entropy(logits, targets, group): logits (N, V/t), this rank's
    vocabulary ids r V/t .. (r+1) V/t - 1; targets (N,) ids in 0..V-1 -> the mean cross-entropy,
    the same on every rank, differentiable: backward gives each rank its logits' gradient.
    The collectives, forward and backward together, must move fewer bytes than a rank's
    (N, V/t) logits: the loss never gathers them."""
    __tracebackhide__ = True
    name = "vocab_parallel_cross_entropy"
    expect_callable(vocab_parallel_cross_entropy, name)
    for i, tp in enumerate(draw_tp_sizes(rng)):
        n, per_rank = rng.randint(3, 12), rng.randint(8, 12)
        if tp > 2:  # a rank's logits 8 KiB or more: gathering them stands clear of the headers
            per_rank = max(per_rank, 4 * wire_floor_units(8 * n))
        logits = 3 * random_tensor((n, tp * per_rank), torch.float64, wide_seed(rng))
        if i == 0:
            logits[::2] += 750.0  # exp(750) overflows float64: the max must come off first
        targets = torch.tensor([rng.randrange(tp * per_rank) for _ in range(n)])
        where = (f"{name} on {tp} ranks, {n} tokens, vocabulary {tp * per_rank} ({per_rank} a "
                 f"rank){', logits near 750' if i == 0 else ''}")
        whole = logits.clone().requires_grad_()
        loss = F.cross_entropy(whole, targets)  # one process, the whole logits
        loss.backward()
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(vocab_parallel_cross_entropy,  # rank r: its (N, V/t) only
                                [(mine.clone(), targets) for mine in logits.chunk(tp, dim=-1)],
                                exercise=name, where=where, hint=LOSS_HINT,
                                harness=loss_in_rank, guard=ANSWERS.in_rank,
                                timeout=timeout, received=received)
        for rank, (got, _) in enumerate(outcomes):
            _expect_loss(got, loss.detach(), whole.grad.chunk(tp, dim=-1)[rank],
                         logits.chunk(tp, dim=-1)[rank], targets, tp, rank, where)
        most = torch_received(_loss_messages, [(n,)] * tp, ways=("three", "stacked"))
        expect_received_data(received, most, where, "communicate only a few numbers per "
                                                    "token: " + LOSS_HINT)
    print(f"{name}: passed on 3 cases drawn afresh (2, 3 and 4 ranks; logits near 750 "
          "included): the loss and every rank's gradient equal F.cross_entropy's, no logits "
          "gathered")


def _loss_messages(n, way):
    """torch's own all-reduces of the loss: each token's max, sum of exp and target's logit,
    as three (n,) all-reduces or two, the sums stacked."""
    row = torch.zeros(n, dtype=torch.float64)
    dist.all_reduce(row, op=dist.ReduceOp.MAX)
    for t in ([row, row.clone()] if way == "three" else [torch.zeros(2, n, dtype=row.dtype)]):
        dist.all_reduce(t)


def _expect_loss(got, loss, grad, mine, targets, tp, rank, where):
    __tracebackhide__ = True
    value, got_grad, backward, collectives = got
    whole = mine.numel() * mine.element_size()  # one rank's logits, in bytes
    moved = sum(nbytes for _, nbytes in collectives)  # forward and backward, all collectives
    if moved >= whole:  # the three sums of N numbers move at most 3/8 of it (V/t >= 8)
        op, largest = max(collectives, key=lambda c: c[1])
        fail(where, rank, f"moved {moved} bytes in {len(collectives)} collectives (the largest "
                          f"a {largest}-byte {op}), as much as a rank's whole logits "
                          f"({tuple(mine.shape)}, {whole} bytes): the loss must not gather the "
                          "logits", "communicate only a few numbers per token: " + LOSS_HINT)
    least = 2 * len(targets) * mine.element_size()  # the normalizer and the target's logit
    if moved < least:  # of each token, from other ranks: no collective brings less
        fail(where, rank, f"moved {moved} bytes in {len(collectives)} collectives, less than "
                          f"{least}: every rank needs, for each of the {len(targets)} tokens, the "
                          "whole vocabulary's sum of exp and the target's logit, which only "
                          "collectives may bring (data moved another way does not count)",
             LOSS_HINT)
    hint = LOSS_HINT
    if isinstance(value, torch.Tensor) and not torch.isfinite(value).all():
        hint = ("exp of a logit near 750 overflows: subtract the max over the whole vocabulary "
                "(an all-reduce with op=dist.ReduceOp.MAX) before exp. " + capital(LOSS_HINT))
    expect_tensor(value, loss, where=f"{where}, the loss", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
    if not backward:
        fail(f"{where}, backward", rank, "the loss does not require grad, so backward cannot "
             "reach the logits: compute it from `logits` with differentiable operations (the "
             "max may be detached) and sum over the ranks with your MegatronG", LOSS_HINT)
    hint = LOSS_HINT
    if close(got_grad, tp * grad):
        hint = (f"the gradient is {tp} times too large: a sum made with torch's differentiable "
                "all_reduce all-reduces in backward too; sum with your MegatronG instead")
    expect_tensor(got_grad, grad, where=f"{where}, backward: logits.grad", rank=rank, hint=hint,
                  tolerance=TOLERANCE, **TOL)
