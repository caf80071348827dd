"""Lesson 05's check of the sharded step (`__init__.py` lists them all):

    check_zero_step(zero_step)   reduce-scatter, Adam on the shard, all-gather

The student's step runs on 2, 3 and 4 ranks after each rank's backward, with models the notebook
never shows (`cases.py`), and every rank's parameters, master shard and master.grad are
compared after every step with one process training on the whole batch with torch's AdamW. The
gradient memory a rank still holds after the step is measured from the storages (stage 2 keeps
only its shard), and what it communicated is watched at torch's dispatcher, so an all-reduce
through the process group's own methods is seen too; what it received is counted by the kernel,
outside it, and bounded by what torch's own reduce-scatters and all-gathers receive
(`core.received`).
"""

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail,
                                  fresh_cases)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.replicas import expect_weights, run_steps, shards, whole_batch
from dlcourse.checks.zero.answers import ANSWERS
from dlcourse.checks.zero.cases import (GRAD_ATOL, build, data, describe_model, draw_cases, flat_of,
                                        gradient, loss_fn, padded_shard, wide_model)
from dlcourse.checks.zero.in_rank import ADAMW, step_in_rank


# ---------------------------------------------------------------- exercise 2: the step

STEP_HINT = ("flatten the gradients (zeros for a None), pad to N x s; reduce-scatter it "
             "(dist.reduce_scatter_single) and divide by N; put it in master.grad and drop the "
             "full gradients (p.grad = None); optimizer.step(); all-gather the masters "
             "(dist.all_gather_single) into an N x s buffer and copy its first Ψ elements back "
             "into the parameters, in order")


@fresh_cases
def check_zero_step(zero_step, timeout=CHECK_TIMEOUT_S, *, rng):
    """zero_step(params, master, optimizer, group), called on every rank after its backward,
    must leave every rank where one process is after AdamW on the whole batch, holding only its
    shard of the gradient, with the masters stepped and gathered."""
    __tracebackhide__ = True
    expect_callable(zero_step, "zero_step")
    for i, (world_size, spec) in enumerate(draw_cases(rng, _psi)):  # the first: N ∤ Ψ
        if i > 0 and world_size > 2:  # the other of 3 and 4 ranks: shards clear of the headers
            spec = wide_model(rng)
        _check_step_case(zero_step, spec, world_size, rng.randint(1, 3), rng.randrange(10**6),
                         timeout)
    print("zero_step: passed on 3 cases (2, 3 and 4 ranks; MLPs and GPTs of random sizes; Ψ "
          "not a multiple of N), 2 AdamW steps equal to one process on the whole batch, only "
          "the gradient shard kept")


def _psi(spec):
    return sum(p.numel() for p in build(spec).parameters())


def _check_step_case(zero_step, spec, world_size, per_rank, data_seed, timeout):
    __tracebackhide__ = True
    W, psi = world_size, _psi(spec)
    s = -(-psi // W)
    batches = [data(spec, W * per_rank, data_seed + k) for k in range(2)]
    steps = [shards(b, [per_rank] * W) for b in batches]  # steps[k][r]: rank r's (x, y)
    where = (f"zero_step on {W} ranks, {describe_model(spec)} (Ψ = {psi}, shards of s = {s}, "
             f"{W * s - psi} padding), {per_rank} samples per rank")
    masters = _masters(spec, W)
    received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
    outcomes = run_steps(zero_step, steps, exercise="zero_step", where=where, hint=STEP_HINT,
                         timeout=timeout, harness=partial(step_in_rank, spec, masters),
                         guard=ANSWERS.in_rank, forbid=("all_reduce", "all_reduce_coalesced"),
                         why_forbidden="stage 1 needs only this rank's shard of the average: "
                                       "reduce-scatter it", received=received)
    model = build(spec)
    expected = whole_batch(model, torch.optim.AdamW(model.parameters(), **ADAMW), batches,
                           loss_fn(spec))
    for k in range(1, 3):
        records = [records[k - 1] for records, _ in outcomes]
        for rank, record in enumerate(records):  # what each rank's shard got and did first
            _expect_shard(spec, record, expected, steps, k, rank, W, where)
        for rank, record in enumerate(records):  # then what the gather made of them
            _expect_gathered(record, expected, k, rank, where)
    _expect_step_received(received, masters[0], W, len(steps), where)


def _expect_step_received(received, shard, W, n_steps, where):
    """What each rank received, counted outside it: no more than torch's own reduce-scatter of
    the N x s gradient buffer and all-gather of the N x s masters receive, each step (the list
    or the tensor forms, the most), and HEADER_ROOM a peer; no less than the others' shards
    twice a step. Gathering every rank's whole gradient buffer where a reduce-scatter belongs
    (W - 1 buffers; gloo's reduce-scatter ~1.5 at 3 ranks, ~1.7 at 4) fails on 3 and 4 ranks,
    whatever the rank's own counter says."""
    __tracebackhide__ = True
    most = torch_received(_step_messages, [(shard, n_steps)] * W, ways=("list", "tensor"))
    least = 2 * n_steps * (W - 1) * shard.numel() * shard.element_size()
    expect_received_data(received, most, where, STEP_HINT, least=[least] * W)


def _step_messages(shard, n_steps, way):
    """torch's own messages of `n_steps` sharded steps: a reduce-scatter of the N x s buffer,
    then an all-gather of the s-element masters, each step."""
    W = dist.get_world_size()
    buffer = shard.new_zeros(W * shard.numel())
    for _ in range(n_steps):
        if way == "list":
            dist.reduce_scatter(torch.empty_like(shard), list(buffer.chunk(W)))
            dist.all_gather(list(buffer.chunk(W)), shard)
        else:
            dist.reduce_scatter_tensor(torch.empty_like(shard), buffer)
            dist.all_gather_into_tensor(buffer, shard)


def _masters(spec, W):
    """[rank r's master shard]: the model's flat parameters padded and cut, as each rank starts."""
    flat = flat_of([p.detach() for p in build(spec).parameters()])
    return [padded_shard(flat, W, rank) for rank in range(W)]


# What a correct step makes: one reduce-scatter of the N x s gradient buffer, one all-gather of
# the N x s masters (`CommRecord.nbytes`: the whole buffer each); a barrier moves nothing.
STEP_COLLECTIVES = ("reduce_scatter", "all_gather", "barrier")


def _expect_collectives(record, k, rank, where):
    """The step's collectives by kind and bytes: an all-reduce rebuilt from others (an
    all-gather of the gradients, summed) fails like the all-reduce itself."""
    __tracebackhide__ = True
    moved, buffer = record["moved"], record["buffer"]
    other = sorted(op for op in moved if op not in STEP_COLLECTIVES)
    if moved.get("reduce_scatter", 0) < buffer:
        made = ", ".join(f"{op} {moved[op]} bytes" for op in sorted(moved)) or "no collective"
        fail(where, rank, f"reduce-scattered {moved.get('reduce_scatter', 0)} bytes in step {k}, "
                          f"not the {buffer}-byte gradient buffer (N x s elements); it made: "
                          f"{made}", "the gradient is averaged by a reduce-scatter of the whole "
                                     "padded buffer, each rank receiving its shard only")
    if moved.get("all_gather", 0) > buffer or other:
        fail(where, rank, f"moved more than the step needs in step {k}: "
                          f"{', '.join(f'{op} {moved[op]} bytes' for op in sorted(moved))}, "
                          f"where a reduce-scatter and an all-gather of {buffer} bytes each do it",
             "all-gather the stepped masters only, never the gradients")


def _expect_shard(spec, record, expected, steps, k, rank, W, where):
    """This rank's communication, master.grad (if kept) and master after step k."""
    __tracebackhide__ = True
    if "all_reduce" in record["ops"]:
        fail(where, rank, f"all-reduced in step {k}: stage 1 reduce-scatters, so each rank "
                          "gets only the average of its own shard (Ψ / N, not Ψ)", STEP_HINT)
    _expect_collectives(record, k, rank, where)
    want_grad = padded_shard(flat_of(_whole_gradient(spec, expected, steps, k)), W, rank)
    names = list(expected[0])
    if record["master_grad"] is not None:
        got = record["master_grad"]
        expect_tensor(got, want_grad, where=f"{where}, master.grad after step {k}", rank=rank,
                      atol=GRAD_ATOL, tolerance=f"{GRAD_ATOL:g} (float64 rounding)",
                      hint=_grad_hint(spec, got, want_grad, expected, steps, k, rank, W))
    want_master = padded_shard(flat_of([expected[k][n] for n in names]), W, rank)
    expect_tensor(record["master"], want_master, where=f"{where}, master after step {k}",
                  rank=rank, atol=GRAD_ATOL, tolerance=f"{GRAD_ATOL:g} (float64 rounding)",
                  hint="step the master shard with the optimizer you were given, after putting "
                       "this rank's averaged gradient shard in master.grad")


def _expect_gathered(record, expected, k, rank, where):
    """The parameters after step k, and the gradients the rank still holds."""
    __tracebackhide__ = True
    expect_weights(record["weights"], expected[k], where=where, rank=rank, step=k,
                   explain=lambda: "every rank's master shard is right but the parameters are "
                                   "not: all-gather the N masters in rank order and copy the "
                                   "first Ψ elements back into the parameters; the padding "
                                   "after them belongs to no parameter")
    if record["held"]:
        fail(where, rank, f"still holds {record['held']:,} bytes of full gradients (p.grad) "
                          f"after step {k}: ZeRO stage 2 keeps only this rank's shard",
             "once the gradients are reduce-scattered, drop them: p.grad = None for every "
             "parameter")


def _whole_gradient(spec, expected, steps, k):
    """[gradient of each parameter, in order] of step k's whole batch at the reference's weights."""
    whole = gradient(spec, expected[k - 1], *(torch.cat(t) for t in zip(*steps[k - 1])))
    return [whole[n] for n in expected[0]]


def _grad_hint(spec, got, want, expected, steps, k, rank, W):
    """Which mistake gives master.grad = got."""
    if torch.allclose(got, W * want, atol=GRAD_ATOL):
        return (f"master.grad is {W} times the average: reduce-scatter sums the ranks' "
                "gradients; divide by the world size")
    if W > 1 and torch.allclose(got, want / W, atol=GRAD_ATOL):
        return "master.grad is 1/N of the average: divide by the world size once"
    whole = flat_of(_whole_gradient(spec, expected, steps, k))
    piece = whole.tensor_split(W)[rank]  # each shard of the unpadded buffer padded on its own
    if torch.allclose(got, F.pad(piece, (0, got.numel() - piece.numel())), atol=GRAD_ATOL):
        return ("each shard was padded on its own, so padding sits between the shards and "
                "the later ranks' shards start at the wrong parameter: pad the whole flat "
                "buffer once, at its end, and cut it at multiples of s")
    own = gradient(spec, expected[k - 1], *steps[k - 1][rank])
    if torch.allclose(got, padded_shard(flat_of(list(own.values())), W, rank), atol=GRAD_ATOL):
        return ("master.grad is this rank's own gradient: it must be the average over the "
                "ranks, reduce-scattered")
    return STEP_HINT
