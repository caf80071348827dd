"""Lesson 04's sequence-parallel checks (the package's `__init__` exports them):

    check_sequence_parallel(GatherSequence, ReduceScatterSequence)   the conjugate pair
    check_layernorm_grads(sync_layernorm_grads)                      the LayerNorm's gradients

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) keeps the activations outside the
tensor-parallel region cut along the sequence: rank r holds tokens r T/t .. (r+1) T/t - 1 of
(B, T, h). Both checks run the same block on t = 2, 3, 4 real ranks, in float64:

    x_r (B, T/t, h) -> LayerNorm -> gather -> column-parallel Linear(h, f) -> gelu
        -> row-parallel Linear(f, h, no bias) -> reduce-scatter -> y_r (B, T/t, h)

against one process running LayerNorm, Linear, gelu, Linear on the whole (B, T, h). Each rank is
sent its tokens, its rows or columns of the weights and its tokens' upstream gradient only. The
collectives are counted by kind and bytes (`CommCounter`): the pair makes, in forward and again
in backward, one all-gather and one reduce-scatter of the whole (B, T, h), nothing else; the
LayerNorm's gradients take one all-reduce of its 2h numbers. `answers.ANSWERS` is refused while
the student's code runs (exercise 8's block runs the lesson's pair before that). And what each
rank received is counted by the kernel, outside it: for the pair, no more than torch's own
all-gathers and reduce-scatters of the same tensors receive (gloo's reduce-scatter receives about
what an all-reduce does, so the measure is torch's, not a formula) and HEADER_ROOM a peer, on 3
and 4 ranks with shards of 2 WIRE_FLOOR bytes or more: every rank's whole tensor gathered where a
reduce-scatter belongs fails, whatever the rank's own counter says. The LayerNorm's
gradients the same way: no more than torch's all-reduce of them receives, on 3 and 4 ranks with
h of 512 or more (4 WIRE_FLOOR bytes).
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse import pickling
from dlcourse.checks.core import (CHECK_TIMEOUT_S, CheckFailed, StudentCode, Submitted,
                                  expect_callable, expect_tensor, fail, kind, random_tensor,
                                  run_on_ranks)
from dlcourse.checks.core.cases import fresh_cases
from dlcourse.checks.core.received import WIRE_FLOOR, expect_received_data, torch_received
from dlcourse.checks.core.stubs import not_written, stub_message
from dlcourse.checks.tensor.answers import ANSWERS
from dlcourse.checks.tensor.cases import draw_tp_sizes, wide_seed
from dlcourse.checks.tensor.in_rank import pair_in_rank, sync_in_rank

# float64: a value is a LayerNorm and two dot products of at most ~40 terms of size ~1, rounded
# differently by one process and a rank, ~1e-14; 1e-10 allows 10^4 times that. The mistakes named
# here move values by 0.01 or more (a share of the tokens, a factor t).
TOL = dict(atol=1e-10, rtol=1e-10)
TOLERANCE = "1e-10 (float64 rounding)"
WHY = "it is the check's own reference for this exercise; write it yourself"
PAIR_HINT = ("GatherSequence: forward all-gathers the ranks' (B, T/t, h) shards along dim 1 (the "
             "sequence), backward reduce-scatters the gradient along dim 1; ReduceScatterSequence "
             "the other way round")
SYNC_HINT = ("each rank's LayerNorm saw only its own tokens: all-reduce (sum) the .grad of its "
             "weight and bias over the group, in place")


# ---------------------------------------------------------------- the block and its reference


SEQUENCE = ANSWERS.but(allow=ANSWERS.allow + ("_shape_checked", "_block"))  # the harness's


def draw_block(rng, tp, h_bytes=0, h_least=0):
    """(x, ln, a, b, upstream): B 1-2, T = tp k, h 2-5, f = tp j; float64, fresh seeds. With
    `h_bytes`, h wide enough that a rank's (B, T/t, h) shard holds that many bytes or more; with
    `h_least`, h that or more."""
    B, T, h = rng.randint(1, 2), tp * rng.randint(1, 3), rng.randint(2, 5)
    h = max(h, h_least, -(-h_bytes // (8 * B * T // tp)))
    f = tp * rng.randint(1, 3)
    ln, a, b = (nn.LayerNorm(h, dtype=torch.float64), nn.Linear(h, f, dtype=torch.float64),
                nn.Linear(f, h, bias=False, dtype=torch.float64))
    with torch.no_grad():
        for p in (*ln.parameters(), *a.parameters(), *b.parameters()):
            p.copy_(random_tensor(p.shape, torch.float64, wide_seed(rng)))
    x = random_tensor((B, T, h), torch.float64, wide_seed(rng))
    return x, ln, a, b, random_tensor((B, T, h), torch.float64, wide_seed(rng))


def reference(x, ln, a, b, upstream):
    """One process, the whole sequence: y and every gradient."""
    x = x.clone().requires_grad_()
    y = b(F.gelu(a(ln(x))))
    (y * upstream).sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in
             [("ln.weight", ln.weight), ("ln.bias", ln.bias), ("a.weight", a.weight),
              ("a.bias", a.bias), ("b.weight", b.weight)]}
    return y.detach(), x.grad.detach(), grads


def own_ln_grads(x, ln, a, b, upstream, tp):
    """[per rank: {"weight", "bias"}]: the LayerNorm gradients rank r holds after the
    sequence-parallel block's backward, before they are synced: its tokens' share of the sum
    (one process, each rank's tokens through a LayerNorm copy of its own)."""
    copies = [copy.deepcopy(ln) for _ in range(tp)]
    normed = torch.cat([c(t) for c, t in zip(copies, x.chunk(tp, dim=1))], dim=1)  # (B, T, h)
    (b(F.gelu(a(normed))) * upstream).sum().backward()
    a.zero_grad(), b.zero_grad()  # a and b are the check's: their gradients are not kept
    return [{"weight": c.weight.grad.detach().clone(), "bias": c.bias.grad.detach().clone()}
            for c in copies]


def rank_args(x, ln, a, b, upstream, tp):
    """Rank r's tokens, the LayerNorm (whole: it is replicated), its rows of A and of A's bias,
    its columns of B, its tokens' upstream gradient."""
    cut = lambda t, dim: [c.detach().clone() for c in t.chunk(tp, dim=dim)]  # noqa: E731
    xs, ups = cut(x, 1), cut(upstream, 1)
    a_w, a_b, b_w = cut(a.weight, 0), cut(a.bias, 0), cut(b.weight, 1)
    ln_state = (ln.weight.detach().clone(), ln.bias.detach().clone())
    return [(xs[r], ln_state, a_w[r], a_b[r], b_w[r], ups[r]) for r in range(tp)]


# ---------------------------------------------------------------- exercise 7: the pair


@fresh_cases
def check_sequence_parallel(gather_sequence, reduce_scatter_sequence, timeout=CHECK_TIMEOUT_S, *,
                            rng):
    """GatherSequence and ReduceScatterSequence, autograd Functions used as `.apply(x, group)`,
    around a column- and a row-parallel layer on t real ranks: y, x's and the weights' gradients
    equal one process's, with one all-gather and one reduce-scatter each way."""
    __tracebackhide__ = True
    for fn, name in ((gather_sequence, "GatherSequence"),
                     (reduce_scatter_sequence, "ReduceScatterSequence")):
        expect_callable(fn, name)
        if not isinstance(fn, Submitted) and not _is_function_class(fn):
            fail(name, None, f"the check needs your autograd Function class itself, not "
                             f"{kind(fn)}")
        stubs = [stub_message(vars(fn)[m].__func__) for m in ("forward", "backward")
                 if not isinstance(fn, Submitted) and isinstance(vars(fn).get(m), staticmethod)]
        if any(text is not None for text in stubs):  # named here, not as the first class
            raise CheckFailed(not_written(name, next(t for t in stubs if t is not None)))
    graded = isinstance(reduce_scatter_sequence, Submitted)  # its rank has no answer module
    other = StudentCode(reduce_scatter_sequence.payload if graded
                        else pickling.dumps(reduce_scatter_sequence),
                        guard=SEQUENCE.in_rank)
    for tp in draw_tp_sizes(rng):
        # on 3 or 4 ranks a reduce-scatter receives less than gathering every rank's whole
        # tensor (on 2, gloo's receives as much): there shards of 2 WIRE_FLOOR bytes or more
        # (measured: such a gather stood ~2.9 KB above the ceiling at 1 WIRE_FLOOR on 4 ranks,
        # ~3 KB at 2 already on 3)
        x, ln, a, b, upstream = draw_block(rng, tp, 2 * WIRE_FLOOR if tp > 2 else 0)
        where = (f"sequence parallelism on {tp} ranks, x {tuple(x.shape)} cut along dim 1, "
                 f"Linear({a.in_features}, {a.out_features})")
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(gather_sequence, [(*r, other) for r in
                                                  rank_args(x, ln, a, b, upstream, tp)],
                                exercise="GatherSequence", where=where, hint=PAIR_HINT,
                                harness=pair_in_rank, guard=SEQUENCE.in_rank, timeout=timeout,
                                received=received)
        y, x_grad, grads = reference(x, ln, a, b, upstream)
        for rank, (got, _) in enumerate(outcomes):
            _expect_pair(got, rank, tp, y, x_grad, grads, x, where)
        _expect_pair_received(received, x, tp, where)
    print("GatherSequence, ReduceScatterSequence: passed on 3 cases drawn afresh "
          "(2, 3 and 4 ranks): every rank's tokens of y, of x's gradient and its weights' "
          "gradients equal one process's; forward and backward each one all-gather and one "
          "reduce-scatter of the whole (B, T, h)")


def _expect_pair_received(received, x, tp, where):
    """What each rank received, counted outside it: no more than torch's own all-gathers and
    reduce-scatters of the same shards receive (and HEADER_ROOM a peer), no less than the
    others' shards four times (two all-gathers, two reduce-scatters)."""
    __tracebackhide__ = True
    shard = x.chunk(tp, dim=1)[0]  # (B, T/t, h)
    nbytes = shard.numel() * shard.element_size()
    most = torch_received(_pair_messages, [(shard,)] * tp, ways=("list", "tensor"))
    expect_received_data(received, most, where, PAIR_HINT, least=[4 * (tp - 1) * nbytes] * tp)


def _pair_messages(shard, way):
    """torch's own messages of the pair on a rank's (B, T/t, h) shard, forward and backward:
    two all-gathers of the shards and two reduce-scatters of the whole (B, T, h), in the list
    forms or the tensor forms."""
    t = dist.get_world_size()
    flat, whole = shard.reshape(-1), torch.cat([shard] * t, dim=1)
    for _ in range(2):
        if way == "list":
            dist.all_gather([torch.empty_like(shard) for _ in range(t)], shard)
            dist.reduce_scatter(torch.empty_like(shard),
                                [c.contiguous() for c in whole.chunk(t, dim=1)])
        else:
            dist.all_gather_into_tensor(flat.new_empty(t * flat.numel()), flat)
            dist.reduce_scatter_tensor(torch.empty_like(flat), whole.transpose(0, 1).reshape(-1))


def _is_function_class(fn):
    return isinstance(fn, type) and issubclass(fn, torch.autograd.Function)


def _expect_pair(got, rank, tp, y, x_grad, grads, x, where):
    __tracebackhide__ = True
    mine = lambda t, dim=1: t.chunk(tp, dim=dim)[rank]  # noqa: E731
    expect_tensor(got["y"], mine(y), where=f"{where}, forward: y", rank=rank,
                  tolerance=TOLERANCE, hint=_y_hint(got["y"], y, tp, rank), **TOL)
    for name, want, dim in (("x", x_grad, 1), ("a.weight", grads["a.weight"], 0),
                            ("a.bias", grads["a.bias"], 0), ("b.weight", grads["b.weight"], 1)):
        expect_tensor(got[name], mine(want, dim), where=f"{where}, backward: {name}.grad",
                      rank=rank, tolerance=TOLERANCE, hint=_grad_hint(got[name], want, tp,
                                                                       rank, dim), **TOL)
    whole = x.numel() * x.element_size()  # bytes of the whole (B, T, h)
    for phase in ("forward", "backward"):
        _expect_collectives(got[phase], whole, phase, rank, where)


def _y_hint(got, y, tp, rank):
    if isinstance(got, torch.Tensor) and got.shape == y.shape:
        return ("this is the whole sequence: ReduceScatterSequence keeps this rank's tokens "
                "only, summed over the ranks")
    if isinstance(got, torch.Tensor) and got.shape != y.chunk(tp, 1)[rank].shape:
        return "the cut is along the sequence, dim 1 of (B, T, h): gather and scatter there"
    return PAIR_HINT


def _grad_hint(got, want, tp, rank, dim):
    if isinstance(got, torch.Tensor) and dim == 1 and torch.allclose(
            got, tp * want.chunk(tp, dim)[rank], **TOL):
        return (f"{tp} times too large: the gradient was summed twice (a reduce-scatter, or an "
                "all-reduce, where the other direction only gathers)")
    if dim == 1:  # x's gradient
        return ("every rank's layers used this rank's tokens, so their gradient is a sum over "
                "the ranks: GatherSequence's backward reduce-scatters along dim 1")
    return PAIR_HINT


def _expect_collectives(records, whole, phase, rank, where):
    """One all-gather of `whole` bytes and one reduce-scatter of `whole` bytes, nothing else."""
    __tracebackhide__ = True
    moved = {}
    for op, nbytes in records:
        moved[op] = moved.get(op, 0) + nbytes
    if moved == {"all_gather": whole, "reduce_scatter": whole}:
        return
    said = ", ".join(f"{op} {n} bytes" for op, n in sorted(moved.items())) or "nothing"
    fail(f"{where}, {phase}", rank, f"moved {said} in {len(records)} collectives; the pair "
                                    f"moves one all-gather of the whole (B, T, h), {whole} bytes,"
                                    f" and one reduce-scatter of it, {whole} bytes",
         "an all-reduce (or gathering every rank's whole tensor) and then keeping a slice moves "
         "t times what a reduce-scatter does; each direction needs exactly one all-gather and "
         "one reduce-scatter (dist.all_gather / dist.reduce_scatter, or their _single forms)")


# ---------------------------------------------------------------- exercise 8: LayerNorm grads


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
