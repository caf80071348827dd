"""Lesson 05's check of a stage-3 unit (`__init__.py` lists them all):

    check_gather_and_free(gather_and_free)   one unit gathered and freed around its passes

The harness shards one unit of a model the notebook never shows (`cases.py`: a GPT's last
block or an MLP's last layer) the way FSDP does: its parameters become views of one flat buffer
whose memory is freed, beside this rank's shard. The student's hooks run forward and backward on
2, 3 and 4 ranks; every gradient is compared with the same model unsharded, the bytes the unit's
parameters hold after each pass are measured (stage 3 frees them), and the collectives of each
pass are counted by kind and bytes (lesson 02's CommCounter): each pass must bring in the other
ranks' shards again, which a full copy kept between passes and a token collective do not. What
each rank received is counted by the kernel too, outside it (`core.received`): the others'
shards once a pass at least, and no more than torch's own all-gathers of them receive, so a
faked counter does not pass either; one case on 3 or 4 ranks is a wider GPT whose shards stand
clear of gloo's headers.
"""

from functools import partial

import torch.distributed as dist

from dlcourse.checks.core import (CHECK_TIMEOUT_S, expect_callable, expect_tensor, fail,
                                  fresh_cases)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.replicas import run_steps, shards, snapshot
from dlcourse.checks.zero.answers import ANSWERS
from dlcourse.checks.zero.cases import (GRAD_ATOL, build, data, describe_model, draw_cases,
                                        flat_of, gradient, padded_shard, wide_model)
from dlcourse.checks.zero.in_rank import unit_in_rank, unit_of


# ---------------------------------------------------------------- exercise 3: a stage-3 unit

UNIT_HINT = ("before forward and again before backward: full.untyped_storage().resize_(bytes "
             "of full), then dist.all_gather_single(full, shard, group=group); after forward and "
             "after backward: full.untyped_storage().resize_(0). Module hooks do it: "
             "register_forward_pre_hook, register_forward_hook, "
             "register_full_backward_pre_hook, register_full_backward_hook, each returning "
             "None. (A backward that fails with 'out of bounds for storage of size 0' ran on "
             "freed parameters.)")


@fresh_cases
def check_gather_and_free(gather_and_free, timeout=CHECK_TIMEOUT_S, *, rng):
    """gather_and_free(unit, full, shard, group) must make the unit gather its parameters
    (views of `full`, freed) from the ranks' shards before its forward and its backward, and
    free them after each: the gradients equal the unsharded model's, nothing held after."""
    __tracebackhide__ = True
    expect_callable(gather_and_free, "gather_and_free")
    for i, (world_size, spec) in enumerate(draw_cases(rng, _unit_psi)):  # the first: N ∤ Ψ
        if i > 0 and world_size > 2:  # the other of 3 and 4 ranks: shards clear of the headers
            spec = wide_model(rng)
        _check_unit_case(gather_and_free, spec, world_size, rng.randrange(10**6), timeout)
    print("gather_and_free: passed on 3 cases (2, 3 and 4 ranks; a GPT block or an MLP layer; "
          "Ψ not a multiple of N), gradients equal to the unsharded model's, parameters "
          "gathered for each pass and freed after it")


def _unit_psi(spec):
    return sum(p.numel() for p in unit_of(build(spec), spec).parameters())


def _check_unit_case(gather_and_free, spec, world_size, data_seed, timeout):
    __tracebackhide__ = True
    W, psi = world_size, _unit_psi(spec)
    s = -(-psi // W)
    micro = [shards(data(spec, W * 2, data_seed + k), [2] * W) for k in range(2)]
    unit = "its last block" if spec[0] == "GPT" else "its output layer"
    where = (f"gather_and_free on {W} ranks, {describe_model(spec)}, {unit} sharded (Ψ = {psi}, "
             f"s = {s})")
    unit_shards = _unit_shards(spec, W)
    received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
    outcomes = run_steps(gather_and_free, micro, exercise="gather_and_free", where=where,
                         hint=UNIT_HINT, timeout=timeout,
                         harness=partial(unit_in_rank, spec, unit_shards),
                         guard=ANSWERS.in_rank, received=received)
    full_bytes = W * s * _itemsize(spec)  # `full`: N shards of s elements
    for rank, (records, _) in enumerate(outcomes):
        for k, record in enumerate(records, 1):
            _expect_unit_pass(spec, record, micro[k - 1][rank], k, rank, where, full_bytes, W)
    _expect_unit_received(received, unit_shards[0], W, 2 * len(micro), where)


def _expect_unit_received(received, shard, W, passes, where):
    """What each rank received, counted outside it: the other ranks' shards once a pass, no
    fewer (a full copy kept, a token collective and a faked counter fail) and no more than
    torch's own all-gathers of them (list or tensor form, the most) and HEADER_ROOM a peer."""
    __tracebackhide__ = True
    most = torch_received(_unit_messages, [(shard, passes)] * W, ways=("list", "tensor"))
    least = passes * (W - 1) * shard.numel() * shard.element_size()
    expect_received_data(received, most, where, UNIT_HINT, least=[least] * W)


def _unit_messages(shard, passes, way):
    """torch's own all-gather of the N shards into `full`, once a pass."""
    W = dist.get_world_size()
    full = shard.new_empty(W * shard.numel())
    for _ in range(passes):
        if way == "list":
            dist.all_gather(list(full.chunk(W)), shard)
        else:
            dist.all_gather_into_tensor(full, shard)


def _unit_shards(spec, W):
    """[rank r's shard of the unit's flat parameters, padded]: what each rank starts from."""
    flat = flat_of([p.detach() for p in unit_of(build(spec), spec).parameters()])
    return [padded_shard(flat, W, rank) for rank in range(W)]


def _itemsize(spec):
    """Bytes per element of the unit's parameters."""
    return next(build(spec).parameters()).element_size()


def _expect_gathered(ops, full_bytes, W, which, rank, where, hint):
    """Fail unless the collectives of one pass (CommCounter's (op, nbytes)) carried the whole
    unit: the others' N - 1 shards at least. A full copy kept between passes and a token
    collective to look busy moves a few bytes; an all-gather of `full` moves N x s elements."""
    __tracebackhide__ = True
    moved, need = sum(nbytes for _, nbytes in ops), full_bytes * (W - 1) // W
    if moved >= need:
        return
    made = ", ".join(f"{op} of {nbytes:,} bytes" for op, nbytes in ops) or "no collective"
    fail(where, rank, f"made {made} in {which}: a correct answer gathers the unit's parameters "
                      f"from the ranks' shards before each pass, one all_gather_into_tensor "
                      f"of `full` ({full_bytes:,} bytes, the other ranks' {need:,} of them), "
                      "and keeps no full copy between passes", hint)


def _expect_unit_pass(spec, record, micro_batch, k, rank, where, full_bytes, W):
    __tracebackhide__ = True
    _expect_gathered(record["forward_ops"], full_bytes, W, f"forward {k}", rank, where,
                     "gather before the unit's forward: " + UNIT_HINT)
    if record["after_forward"]:
        fail(where, rank, f"still holds {record['after_forward']:,} bytes of the unit's gathered "
                          f"parameters after forward {k}: stage 3 frees them as soon as the "
                          "unit's forward is done", "free them in a forward hook "
                                                   "(full.untyped_storage().resize_(0))")
    _expect_gathered(record["backward_ops"], full_bytes, W, f"backward {k}", rank, where,
                     "gather again before the unit's backward (register_full_backward_pre_hook):"
                     " resizing the storage back gives memory, not the values")
    if record["after_backward"]:
        fail(where, rank, f"still holds {record['after_backward']:,} bytes of the unit's "
                          f"gathered parameters after backward {k}",
             "free them again once the unit's backward is done (register_full_backward_hook)")
    model = build(spec)
    want = gradient(spec, snapshot(model), *micro_batch)
    for name, grad in want.items():
        expect_tensor(record["grads"][name], grad, where=f"{where}, gradient of {name} in "
                      f"backward {k}", rank=rank, atol=GRAD_ATOL,
                      tolerance=f"{GRAD_ATOL:g} (float64 rounding)",
                      hint="gather every rank's shard in rank order into `full` before forward "
                           "and before backward: " + UNIT_HINT)
