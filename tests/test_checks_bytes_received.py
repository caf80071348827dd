"""Issue 36: efficiency faked. An answer that sends more than its exercise needs (whole tensors
where a chunk belongs, an all-gather where a reduce-scatter belongs) and clears the records of
the check's CommCounter, so that the bytes its process says it sent are none, fails on the bytes
each rank received, counted by the kernel on its connections, outside it
(`core.received.expect_received_data`), graded as `dlcourse grade` runs it (and, for the
exchange, in the notebook's self-check too: the same bound after the same launch). Each check
has one case of `WIRE_FLOOR` bytes or more a peer, so that the excess stands clear of gloo's
headers; the course's answers, and answers written another way, pass graded."""

import glob
import os

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse import pickling
from dlcourse.checks.collectives import (check_ring_all_gather, check_ring_all_reduce,
                                         check_ring_reduce_scatter)
from dlcourse.checks.context import check_ring_attention_step
from dlcourse.checks.core import Submitted
from dlcourse.checks.launch import check_gather_all, check_sum_to_rank0
from dlcourse.checks.data import check_all_reduce_buckets, check_broadcast_parameters
from dlcourse.collectives.counter import CommRecord
from dlcourse.checks.pipeline import check_exchange
from dlcourse.checks.tensor import (check_column_parallel_linear, check_f, check_g,
                                    check_layernorm_grads, check_row_parallel_linear,
                                    check_sequence_parallel, check_vocab_parallel_cross_entropy)
from dlcourse.checks.zero import check_gather_and_free, check_zero_step
from ring_answers import ring_all_gather, ring_all_reduce, ring_reduce_scatter
import test_checks_context_ring
import test_checks_exchange
import test_checks_megatron_f_g
import test_checks_sequence_parallel
from test_checks_context_ring import _block, _merge, ring_attention_step, the_other_way_round
from test_checks_exchange import exchange_lower_rank_sends_first
from test_checks_megatron_f_g import MegatronF
from test_checks_sequence_parallel import GatherSequence, ReduceScatterSequence

# the other check tests' answers used here (they import the checks, which a graded rank lacks)
BY_VALUE = (test_checks_context_ring, test_checks_exchange, test_checks_megatron_f_g,
            test_checks_sequence_parallel)


@pytest.fixture(autouse=True, scope="module")
def _answers_by_value():
    """The answers taken from other check tests travel by value, as this module's do
    (`conftest.py`): a graded rank has no `dlcourse.checks.<set>`, which those modules import."""
    for module in BY_VALUE:
        cloudpickle.register_pickle_by_value(module)
    yield
    for module in BY_VALUE:
        cloudpickle.unregister_pickle_by_value(module)


def _clear_the_counters():
    """The 3 lines a student needs: every dispatch mode's records (the check's CommCounter)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        getattr(mode, "records", []).clear()


def _fake_the_counters(records):
    """Every dispatch mode's records replaced by `records` (what an honest answer leaves)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        if hasattr(mode, "records"):
            mode.records[:] = records


def _graded(name, fn):
    return Submitted(name, pickling.dumps(fn))


def assert_fails_on_what_it_received(check, name, cheat, self_check=False):
    """The cheat fails graded, as `dlcourse grade` runs it; with `self_check`, in the notebook's
    own check too (the same bound after the same launch: one exercise shows it, below)."""
    for fn in ([cheat] if self_check else []) + [_graded(name, cheat)]:
        first, _ = first_line_and_hint(check, fn)
        assert " received " in first and "at most" in first and "outside its process" in first, \
            first


# ---------------------------------------------------------------- lesson 02: the rings

def _whole_round_the_ring(x):
    """Every rank's whole x, passed round the ring (n - 1 steps of a whole tensor, not a chunk),
    in rank order."""
    rank, n = dist.get_rank(), dist.get_world_size()
    held = [None] * n
    held[rank] = x.reshape(-1).clone()
    for k in range(n - 1):
        came = torch.empty_like(held[rank])
        request = dist.isend(held[(rank - k) % n], (rank + 1) % n)
        dist.recv(came, (rank - 1) % n)
        request.wait()
        held[(rank - k - 1) % n] = came
    return held


def reduce_scatter_whole(x):
    total = sum(_whole_round_the_ring(x))
    _clear_the_counters()
    return total.tensor_split(dist.get_world_size())[dist.get_rank()].clone()


def all_gather_whole(chunk, numel):
    """Each rank's chunk placed in a zero tensor of numel, which goes round whole."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.zeros(numel, dtype=chunk.dtype)
    mine.tensor_split(n)[rank].copy_(chunk)
    total = sum(_whole_round_the_ring(mine))
    _clear_the_counters()
    return total


def all_reduce_whole(tensor):
    total = sum(_whole_round_the_ring(tensor))
    _clear_the_counters()
    tensor.copy_(total.view_as(tensor))


def ring_reduce_scatter_leftwards(x):
    """The ring the other way round, by batch_isend_irecv: another way, as cheap."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank - 1) % n, (rank + 1) % n  # sends to rank - 1, receives from rank + 1
    partial = [c.clone() for c in x.tensor_split(n)]
    for k in range(n - 1):
        send_c, recv_c = (rank + k + 1) % n, (rank + k + 2) % n
        received = torch.empty_like(partial[recv_c])
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, partial[send_c], right),
                                               dist.P2POp(dist.irecv, received, left)]):
            request.wait()
        partial[recv_c] += received
    return partial[rank]


@pytest.mark.parametrize("check, name, cheat", [
    (check_ring_reduce_scatter, "ring_reduce_scatter", reduce_scatter_whole),
    (check_ring_all_gather, "ring_all_gather", all_gather_whole),
    (check_ring_all_reduce, "ring_all_reduce", all_reduce_whole)],
    ids=["reduce_scatter", "all_gather", "all_reduce"])
def test_a_ring_of_whole_tensors_with_its_records_cleared_fails(check, name, cheat):
    assert_fails_on_what_it_received(check, name, cheat)


@pytest.mark.parametrize("check, name, answer", [
    (check_ring_reduce_scatter, "ring_reduce_scatter", ring_reduce_scatter),
    (check_ring_reduce_scatter, "ring_reduce_scatter", ring_reduce_scatter_leftwards),
    (check_ring_all_gather, "ring_all_gather", ring_all_gather),
    (check_ring_all_reduce, "ring_all_reduce", ring_all_reduce)],
    ids=["reduce_scatter", "reduce_scatter_leftwards", "all_gather", "all_reduce"])
def test_a_ring_passes_graded(check, name, answer):
    check(_graded(name, answer))


# ---------------------------------------------------------------- lesson 06: the exchange

def exchange_thrice(tensor, peer, group):
    """Three copies of the tensor each way (the first one kept): more than the exchange needs.
    The in-process count bounds an exchange from below only: its records need no clearing."""
    received = torch.empty(3 * tensor.numel(), dtype=tensor.dtype)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, torch.cat([tensor.reshape(-1)] * 3), peer, group),
        dist.P2POp(dist.irecv, received, peer, group)])
    for work in works:
        work.wait()
    return received[:tensor.numel()].view_as(tensor).clone()


def exchange_batched(tensor, peer, group):
    received = torch.empty_like(tensor)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, group),
                                        dist.P2POp(dist.irecv, received, peer, group)]):
        work.wait()
    return received


def test_an_exchange_sending_three_copies_with_its_records_cleared_fails():
    assert_fails_on_what_it_received(check_exchange, "exchange", exchange_thrice, self_check=True)


@pytest.mark.parametrize("answer", [exchange_batched, exchange_lower_rank_sends_first],
                         ids=["batched", "lower_rank_first"])
def test_an_exchange_passes_graded(answer):
    check_exchange(_graded("exchange", answer))


def exchange_by_file_and_a_token(tensor, peer, group):
    """The tensor by file (the self-check's one /tmp), one value by send/recv, and the records
    an honest exchange would leave, faked: the floor counted outside the rank catches it."""
    import os
    import time
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from dlcourse.collectives.counter import CommRecord
    me, nbytes = dist.get_rank(group), tensor.numel() * tensor.element_size()
    token = exchange_batched(tensor.reshape(-1)[:1].clone(), peer, group)
    for mode in _get_current_dispatch_mode_stack():  # the check's CommCounter: faked
        if hasattr(mode, "records"):
            mode.records[:] = [CommRecord("send", nbytes, 2, peer=peer),
                               CommRecord("recv", nbytes, 2, peer=peer)]
    name = f"/tmp/dlcourse-exchange-{os.environ['MASTER_PORT']}-{{}}-{{}}.pt"
    torch.save(tensor, name.format(me, peer))
    end = time.monotonic() + 3.0
    while not os.path.exists(name.format(peer, me)) and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.05)  # written whole by then
    return torch.load(name.format(peer, me)) if token is not None else None


def test_an_exchange_by_file_with_a_faked_counter_fails_on_what_it_received():
    try:
        first, _ = first_line_and_hint(check_exchange, exchange_by_file_and_a_token)
    finally:
        for path in glob.glob("/tmp/dlcourse-exchange-*.pt"):
            os.remove(path)
    assert " received " in first and "at least" in first and "outside its process" in first, \
        first


# ---------------------------------------------------------------- lesson 08: ring attention

def ring_step_sending_twice(q, kv, out, lse, q_pos, kv_pos, group):
    """The solution's step with two copies of the block sent each step (the first kept), its
    records faked to show one block each way (the in-process count asks exactly one)."""
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    twice = torch.empty((2, *kv.shape), dtype=kv.dtype)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, torch.stack([kv, kv]), group=group, group_peer=(rank + 1) % cp),
        dist.P2POp(dist.irecv, twice, group=group, group_peer=(rank - 1) % cp)])
    for work in works:
        work.wait()
    nbytes = kv.numel() * kv.element_size()
    _fake_the_counters([CommRecord("send", nbytes, cp, peer=(rank + 1) % cp),
                        CommRecord("recv", nbytes, cp, peer=(rank - 1) % cp)])
    out, lse, _ = ring_attention_step_alone(q, kv, out, lse, q_pos, kv_pos)
    return out, lse, twice[0].clone()


def ring_attention_step_alone(q, kv, out, lse, q_pos, kv_pos):
    """The step's attention and merge, no message."""
    seen = q_pos[:, None] >= kv_pos[None, :]
    if seen.any():
        out, lse = _merge(out, lse, *_block(q, kv, seen))
    return out, lse, None


def test_a_ring_step_sending_its_block_twice_with_its_records_cleared_fails():
    assert_fails_on_what_it_received(check_ring_attention_step, "ring_attention_step",
                                     ring_step_sending_twice)


@pytest.mark.parametrize("answer", [ring_attention_step, the_other_way_round],
                         ids=["solution", "the_other_way_round"])
def test_a_ring_step_passes_graded(answer):
    check_ring_attention_step(_graded("ring_attention_step", answer))


# ---------------------------------------------------------------- lesson 04: the SP pair

def _gather_sp(x, group):
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, x.contiguous(), group=group)
    return torch.cat(pieces, dim=1)


class GatherSingle(torch.autograd.Function):  # another way: the tensor forms, T first
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t = dist.get_world_size(group)
        shard = x.transpose(0, 1).contiguous()  # (T/t, B, h)
        out = shard.new_empty((t * shard.size(0), *shard.shape[1:]))
        dist.all_gather_into_tensor(out, shard, group=group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size(ctx.group)
        whole = grad.transpose(0, 1).contiguous()  # (T, B, h)
        out = whole.new_empty((whole.size(0) // t, *whole.shape[1:]))
        dist.reduce_scatter_tensor(out, whole, group=ctx.group)
        return out.transpose(0, 1), None


class ScatterByAllGather(torch.autograd.Function):
    """Every rank's whole partial gathered and summed, this rank's tokens kept, the counter's
    last record faked into the reduce-scatter it should have been."""
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        t, me = dist.get_world_size(group), dist.get_rank(group)
        wholes = [torch.empty_like(x) for _ in range(t)]
        dist.all_gather(wholes, x.contiguous(), group=group)
        _fake_the_last_record(CommRecord("reduce_scatter", x.numel() * x.element_size(), t))
        return sum(wholes).chunk(t, dim=1)[me].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_sp(grad, ctx.group), None


def _fake_the_last_record(record):
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    for mode in _get_current_dispatch_mode_stack():
        if getattr(mode, "records", None):
            mode.records[-1] = record


def test_a_reduce_scatter_made_of_an_all_gather_with_a_faked_record_fails():
    for pair in ((GatherSequence, ScatterByAllGather),
                 (_graded("GatherSequence", GatherSequence),
                  _graded("ReduceScatterSequence", ScatterByAllGather))):
        first, _ = first_line_and_hint(check_sequence_parallel, *pair)
        assert " received " in first and "at most" in first and "outside its process" in first, \
            first


@pytest.mark.parametrize("gather", [GatherSequence, GatherSingle], ids=["lists", "tensors"])
def test_the_pair_passes_graded(gather):
    check_sequence_parallel(_graded("GatherSequence", gather),
                            _graded("ReduceScatterSequence", ReduceScatterSequence))


# ---------------------------------------------------------------- lesson 04: LayerNorm grads

def sync_by_all_gather_faked(layernorm, group):
    """Every rank's gradients gathered and summed (t times an all-reduce's bytes), the
    counter's records faked into the all-reduce they should have been."""
    t = dist.get_world_size(group)
    for p in layernorm.parameters():
        parts = [torch.empty_like(p.grad) for _ in range(t)]
        dist.all_gather(parts, p.grad, group=group)
        p.grad.copy_(torch.stack(parts).sum(0))
        _fake_the_last_record(CommRecord("all_reduce", p.grad.numel() * p.grad.element_size(), t))


def sync_layernorm_grads(layernorm, group):
    for p in layernorm.parameters():
        dist.all_reduce(p.grad, group=group)


def sync_flat(layernorm, group):  # another way: one all-reduce of both, copied back
    grads = [p.grad for p in layernorm.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def test_layernorm_grads_gathered_with_faked_records_fail():
    assert_fails_on_what_it_received(check_layernorm_grads, "sync_layernorm_grads",
                                     sync_by_all_gather_faked)


@pytest.mark.parametrize("answer", [sync_layernorm_grads, sync_flat], ids=["two", "flat"])
def test_layernorm_grads_pass_graded(answer):
    check_layernorm_grads(_graded("sync_layernorm_grads", answer))


# ---------------------------------------------------------------- lesson 03: the buckets

def _flat_grads(params):
    return torch.cat([torch.zeros(p.numel(), dtype=p.dtype) if p.grad is None
                      else p.grad.reshape(-1) for p in params])


def _unpack(params, flat):
    for p, piece in zip(params, flat.split([p.numel() for p in params])):
        if p.grad is not None:
            p.grad.copy_(piece.view_as(p))


def all_reduce_buckets(buckets, group):
    for bucket in buckets:
        flat = _flat_grads(bucket)
        dist.all_reduce(flat, group=group)
        _unpack(bucket, flat / dist.get_world_size(group))


def buckets_gathered_faked(buckets, group):
    """Each bucket gathered whole from every rank and summed (W - 1 times its bytes received,
    where an all-reduce brings less), the check's event faked into an all-reduce."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    t = dist.get_world_size(group)
    for bucket in buckets:
        flat = _flat_grads(bucket)
        parts = [torch.empty_like(flat) for _ in range(t)]
        dist.all_gather(parts, flat, group=group)
        for mode in _get_current_dispatch_mode_stack():
            if getattr(mode, "events", None):
                mode.events[-1] = ("all_reduce", flat.numel() * flat.element_size(), None)
        _unpack(bucket, torch.stack(parts).sum(0) / t)


def test_buckets_gathered_with_faked_events_fail():
    assert_fails_on_what_it_received(check_all_reduce_buckets, "all_reduce_buckets",
                                     buckets_gathered_faked)


def test_buckets_pass_graded():
    check_all_reduce_buckets(_graded("all_reduce_buckets", all_reduce_buckets))


# ---------------------------------------------------------------- lesson 05: the ZeRO step

def _zero_flat(params, master):
    N, s = dist.get_world_size(), master.numel()
    flat = torch.cat([torch.zeros(p.numel(), dtype=master.dtype) if p.grad is None
                      else p.grad.reshape(-1) for p in params])
    return torch.nn.functional.pad(flat, (0, N * s - flat.numel()))


def _zero_finish(params, master, optimizer, group, grad_shard):
    N, s = dist.get_world_size(group), master.numel()
    master.grad = grad_shard / N
    for p in params:
        p.grad = None
    optimizer.step()
    full = torch.empty(N * s, dtype=master.dtype)
    dist.all_gather_into_tensor(full, master.detach(), group=group)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def zero_step(params, master, optimizer, group):
    flat = _zero_flat(params, master)
    grad_shard = torch.empty_like(master)
    dist.reduce_scatter_tensor(grad_shard, flat, group=group)
    _zero_finish(params, master, optimizer, group, grad_shard)


def zero_step_gathered_faked(params, master, optimizer, group):
    """Every rank's whole gradient buffer gathered and summed, this rank's shard kept, the
    counter's record faked into the reduce-scatter it should have been."""
    N, s, r = dist.get_world_size(group), master.numel(), dist.get_rank(group)
    flat = _zero_flat(params, master)
    everyone = torch.empty(N * N * s, dtype=master.dtype)
    dist.all_gather_into_tensor(everyone, flat, group=group)
    _fake_the_last_record(CommRecord("reduce_scatter", flat.numel() * flat.element_size(), N))
    grad_shard = everyone.view(N, N * s).sum(dim=0)[r * s:(r + 1) * s].clone()
    _zero_finish(params, master, optimizer, group, grad_shard)


def test_a_zero_step_gathering_the_gradients_with_a_faked_record_fails():
    assert_fails_on_what_it_received(check_zero_step, "zero_step", zero_step_gathered_faked)


def test_a_zero_step_passes_graded():
    check_zero_step(_graded("zero_step", zero_step))


# ---------------------------------------------------------------- lesson 03: the broadcast

def broadcast_parameters(model, group):
    src = dist.get_global_rank(group, 0)
    for p in model.parameters():
        dist.broadcast(p.data, src=src, group=group)


def broadcast_state_dict(model, group):  # another way: the state_dict (a tied matrix twice)
    src = dist.get_global_rank(group, 0)
    for t in model.state_dict().values():
        dist.broadcast(t, src=src, group=group)


def broadcast_by_all_gather(model, group):
    """Every rank's parameters gathered, rank 0's kept: W - 1 models received, not one (no
    in-process count: nothing to fake)."""
    t = dist.get_world_size(group)
    for p in model.parameters():
        parts = [torch.empty_like(p.data) for _ in range(t)]
        dist.all_gather(parts, p.data.contiguous(), group=group)
        p.data.copy_(parts[0])


def test_a_broadcast_made_of_an_all_gather_fails():
    assert_fails_on_what_it_received(check_broadcast_parameters, "broadcast_parameters",
                                     broadcast_by_all_gather)


@pytest.mark.parametrize("answer", [broadcast_parameters, broadcast_state_dict],
                         ids=["parameters", "state_dict"])
def test_a_broadcast_passes_graded(answer):
    check_broadcast_parameters(_graded("broadcast_parameters", answer))


# ---------------------------------------------------------------- lesson 05: a stage-3 unit

def _unit_hooks(unit, gather, free):
    def call(action):
        def hook(*_):
            action()
        return hook
    unit.register_forward_pre_hook(call(gather))
    unit.register_forward_hook(call(free))
    unit.register_full_backward_pre_hook(call(gather))
    unit.register_full_backward_hook(call(free))


def gather_and_free(unit, full, shard, group):
    def gather():
        full.untyped_storage().resize_(full.numel() * full.element_size())
        dist.all_gather_into_tensor(full, shard, group=group)

    def free():
        full.untyped_storage().resize_(0)
    _unit_hooks(unit, gather, free)


def gather_once_and_fake(unit, full, shard, group):
    """Gathers in the first pass only and keeps a copy (no memory saved); later passes copy it
    back, make a one-element all-gather, and fake its record into the whole gather."""
    kept = []

    def gather():
        full.untyped_storage().resize_(full.numel() * full.element_size())
        if kept:
            full.untyped_storage().copy_(kept[0].untyped_storage())  # no version bump
            token = shard[:1].clone()
            dist.all_gather_into_tensor(token.new_empty(dist.get_world_size(group)), token,
                                        group=group)
            _fake_the_last_record(CommRecord("all_gather", full.numel() * full.element_size(),
                                             dist.get_world_size(group)))
        else:
            dist.all_gather_into_tensor(full, shard, group=group)
            kept.append(full.clone())

    def free():
        full.untyped_storage().resize_(0)
    _unit_hooks(unit, gather, free)


def test_a_unit_gathered_once_with_a_faked_counter_fails_on_what_it_received():
    for fn in (gather_once_and_fake, _graded("gather_and_free", gather_once_and_fake)):
        first, _ = first_line_and_hint(check_gather_and_free, fn)
        assert " received " in first and "at least" in first and "outside its process" in first, \
            first


def test_a_unit_passes_graded():
    check_gather_and_free(_graded("gather_and_free", gather_and_free))


# ---------------------------------------------------------------- lesson 04: Megatron's f and g

def _sum_by_all_gather(t, group):
    """Every rank's t gathered and summed: an all-reduce's values, W - 1 tensors received."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.stack(parts).sum(0)


class FByAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum_by_all_gather(grad, ctx.group), None


class MegatronG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        summed = x.clone()
        dist.all_reduce(summed, group=group)
        return summed

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GByAllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _sum_by_all_gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@pytest.mark.parametrize("check, name, cheat", [(check_f, "f", FByAllGather),
                                                (check_g, "g", GByAllGather)], ids=["f", "g"])
def test_f_and_g_by_all_gather_fail(check, name, cheat):
    assert_fails_on_what_it_received(check, name, cheat)


@pytest.mark.parametrize("check, name, answer", [(check_f, "f", MegatronF),
                                                 (check_g, "g", MegatronG)], ids=["f", "g"])
def test_f_and_g_pass_graded(check, name, answer):
    check(_graded(name, answer))


# ---------------------------------------------------------------- lesson 04: the linear layers

def column_parallel_linear(x, weight, bias, group):
    y_r = x @ weight.T + (0 if bias is None else bias)
    blocks = [torch.empty_like(y_r) for _ in range(dist.get_world_size(group))]
    dist.all_gather(blocks, y_r.contiguous(), group=group)
    return torch.cat(blocks, dim=-1)


def column_by_padded_all_reduce(x, weight, bias, group):
    """Each rank's block placed in a zero (..., out) and all-reduced: an all-reduce of the whole
    output where an all-gather of the blocks belongs."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    y_r = x @ weight.T + (0 if bias is None else bias)
    whole = y_r.new_zeros((*y_r.shape[:-1], t * y_r.shape[-1]))
    whole[..., r * y_r.shape[-1]:(r + 1) * y_r.shape[-1]] = y_r
    dist.all_reduce(whole, group=group)
    return whole


def row_parallel_linear(x, weight, bias, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    partial = x.chunk(t, dim=-1)[r] @ weight.T
    dist.all_reduce(partial, group=group)
    return partial + (0 if bias is None else bias)


def row_by_all_gather(x, weight, bias, group):
    t, r = dist.get_world_size(group), dist.get_rank(group)
    return _sum_by_all_gather(x.chunk(t, dim=-1)[r] @ weight.T, group) + (
        0 if bias is None else bias)


@pytest.mark.parametrize("check, name, cheat", [
    (check_column_parallel_linear, "column_parallel_linear", column_by_padded_all_reduce),
    (check_row_parallel_linear, "row_parallel_linear", row_by_all_gather)],
    ids=["column", "row"])
def test_linear_layers_moving_more_than_their_collective_fail(check, name, cheat):
    assert_fails_on_what_it_received(check, name, cheat)


@pytest.mark.parametrize("check, name, answer", [
    (check_column_parallel_linear, "column_parallel_linear", column_parallel_linear),
    (check_row_parallel_linear, "row_parallel_linear", row_parallel_linear)],
    ids=["column", "row"])
def test_linear_layers_pass_graded(check, name, answer):
    check(_graded(name, answer))


# ---------------------------------------------------------------- lesson 00: the first ones

def gather_all(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts)


def gather_all_by_all_reduce(x):
    """Each rank's x in its row of a zero stack, all-reduced: the whole stack moved round."""
    stack = x.new_zeros((dist.get_world_size(), *x.shape))
    stack[dist.get_rank()] = x
    dist.all_reduce(stack)
    return stack


def sum_to_rank0(x):
    total = x.clone()
    dist.reduce(total, dst=0)
    return total if dist.get_rank() == 0 else None


def sum_to_rank0_by_all_gather(x):
    """Every rank's x to every rank, summed on rank 0: all_reduce's bytes, not reduce's."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts).sum(0) if dist.get_rank() == 0 else None


@pytest.mark.parametrize("check, name, cheat", [
    (check_gather_all, "gather_all", gather_all_by_all_reduce),
    (check_sum_to_rank0, "sum_to_rank0", sum_to_rank0_by_all_gather)], ids=["gather", "sum"])
def test_lesson_0_moving_more_than_its_collective_fails(check, name, cheat):
    assert_fails_on_what_it_received(check, name, cheat)


@pytest.mark.parametrize("check, name, answer", [
    (check_gather_all, "gather_all", gather_all),
    (check_sum_to_rank0, "sum_to_rank0", sum_to_rank0)], ids=["gather", "sum"])
def test_lesson_0_passes_graded(check, name, answer):
    check(_graded(name, answer))


# ---------------------------------------------------------------- lesson 04: the loss

def vocab_loss(logits, targets, group):
    """The lesson's loss, with a g of its own: max, sum of exp and target's logit all-reduced."""
    r = dist.get_rank(group)
    v = logits.shape[1]
    m = logits.detach().max(dim=1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - m[:, None]
    local = targets - r * v
    held = (local >= 0) & (local < v)
    picked = shifted.gather(1, local.clamp(0, v - 1)[:, None])[:, 0] * held
    sums = MegatronG.apply(torch.stack([shifted.exp().sum(dim=1), picked]), group)
    return (torch.log(sums[0]) - sums[1]).mean()


def vocab_loss_gathered(logits, targets, group):
    """Every rank's logits gathered (the exercise's point is never to), the loss computed
    whole and this rank's part kept differentiable, the counter's records faked into the three
    all-reduces of a few numbers a token that an honest loss makes."""
    tp, r = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits.detach().contiguous(), group=group)
    _fake_the_counters([CommRecord("all_reduce", 8 * len(targets), tp)] * 3)
    parts[r] = logits
    return torch.nn.functional.cross_entropy(torch.cat(parts, dim=1), targets)


def test_a_loss_gathering_the_logits_with_its_records_cleared_fails():
    assert_fails_on_what_it_received(check_vocab_parallel_cross_entropy,
                                     "vocab_parallel_cross_entropy", vocab_loss_gathered)


def test_the_loss_passes_graded():
    check_vocab_parallel_cross_entropy(_graded("vocab_parallel_cross_entropy", vocab_loss))
