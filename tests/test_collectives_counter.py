"""CommCounter (lessons 02, 03, 05) and the cost model against what the ranks really sent."""

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import dlcourse
from dlcourse.collectives import (
    ALGORITHMS,
    CommCounter,
    fit_alpha_beta,
    naive_all_reduce,
    ring_all_reduce,
    tree_all_reduce,
)
from dlcourse.collectives.measure import time_ops

# nccl-tests' bus factors (doc/PERFORMANCE.md), written out here independently of cost.py.
NCCL_TESTS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                     "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1,
                     "reduce": lambda n: 1, "send": lambda n: 1, "recv": lambda n: 1}


def launch(fn, *args, world_size):
    return dlcourse.launch(fn, *args, world_size=world_size, backend="gloo", timeout=20)


def torch_ops():
    """Every kind of torch call the contract names, and what the record of each must say."""
    rank, n = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group([0, 1])
    t = torch.ones(6)  # 24 bytes
    expected = []
    with CommCounter() as comm:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        expected += [("all_reduce", 24, n)] * 2
        dist.all_gather_into_tensor(torch.empty(6 * n), t)  # the full output: 24 n
        dist.reduce_scatter_tensor(torch.empty(6), torch.ones(6 * n))  # the full input: 24 n
        dist.all_gather([torch.empty(6) for _ in range(n)], t)
        dist.reduce_scatter(torch.empty(6), [torch.ones(6) for _ in range(n)])
        expected += [("all_gather", 24 * n, n), ("reduce_scatter", 24 * n, n)] * 2
        dist.broadcast(t, src=0)
        dist.reduce(t, dst=0)
        expected += [("broadcast", 24, n), ("reduce", 24, n)]
        # Functional collectives, as DTensor issues them: they name their group.
        funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
        funcol.wait_tensor(funcol.all_gather_tensor(t, 0, dist.group.WORLD))
        expected += [("all_reduce", 24, n), ("all_gather", 24 * n, n)]
        if rank < 2:
            dist.all_reduce(t.double(), group=pair)  # 48 bytes on a group of 2
            other = 1 - rank
            sent = dist.isend(t[:2], other) if rank == 0 else dist.irecv(t[:2], other)
            sent.wait()
            ops = [dist.P2POp(dist.isend, t[:3], other), dist.P2POp(dist.irecv, t[3:], other)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            expected += [("all_reduce", 48, 2), ("send" if rank == 0 else "recv", 8, n),
                         ("send", 12, n), ("recv", 12, n)]
    got = [(r.op, r.nbytes, r.group_size) for r in comm.records]
    bus = sum(b * NCCL_TESTS_FACTOR[op](g) for op, b, g in expected)
    return got, expected, comm.bus_bytes(), bus


def test_counter_records_torch_ops_with_nccl_tests_sizes():
    for got, expected, bus_bytes, bus in launch(torch_ops, world_size=3):
        assert got == expected
        assert math.isclose(bus_bytes, bus)


def results_with_and_without_counter():
    rank = dist.get_rank()
    x = torch.arange(8.0) * (rank + 1)
    plain, counted = x.clone(), x.clone()
    dist.all_reduce(plain)
    ring_all_reduce(plain)
    with CommCounter() as comm:
        dist.all_reduce(counted)
        ring_all_reduce(counted)
    dist.all_reduce(counted)  # after the block: not recorded
    dist.all_reduce(plain)
    return torch.equal(plain, counted), len(comm.records), len(_get_current_dispatch_mode_stack())


def test_counter_changes_no_result_and_stops_at_exit():
    for same, records, modes_left in launch(results_with_and_without_counter, world_size=2):
        assert same
        assert records == 2
        assert modes_left == 0


def course_records(numel):
    with CommCounter() as comm:
        ring_all_reduce(torch.ones(numel))
        naive_all_reduce(torch.ones(numel))
        tree_all_reduce(torch.ones(numel))
    return comm.records


def test_course_collectives_are_recorded_once_with_their_messages_inside():
    n, numel = 4, 1024  # divisible by n: every ring message is S/n
    for rank, (ring, naive, tree) in enumerate(launch(course_records, numel, world_size=n)):
        size = 4 * numel
        for record, algorithm in ((ring, "ring"), (naive, "naive"), (tree, "tree")):
            assert (record.op, record.nbytes, record.group_size, record.algorithm) == \
                ("all_reduce", size, n, algorithm)
        # The ring's sends are exactly its bus bytes (2(n-1)/n S) and its model's steps and bytes.
        sends = [r for r in ring.inner if r.op == "send"]
        model = ALGORITHMS["ring all_reduce"]
        assert sum(r.nbytes for r in sends) == ring.bus_bytes() == model.bytes_moved(size, n)
        assert len(sends) == model.steps(n)
        assert {r.peer for r in sends} == {(rank + 1) % n}
        # The naive root moves 2(n-1) whole tensors, one after another, as its model says.
        if rank == 0:
            model = ALGORITHMS["naive all_reduce"]
            assert len(naive.inner) == model.steps(n)
            assert sum(r.nbytes for r in naive.inner) == model.bytes_moved(size, n)
        # The tree all-reduce is a tree reduce then a tree broadcast, each recorded inside it.
        assert [r.op for r in tree.inner] == ["reduce", "broadcast"]


def ddp_buckets():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    watched = torch.nn.parallel.DistributedDataParallel(model)
    plain = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)))
    plain.load_state_dict(watched.state_dict())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    with CommCounter() as comm:
        comm.watch_ddp(watched)
        watched(x).sum().backward()
    plain(x).sum().backward()
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(watched.parameters(), plain.parameters()))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return [(r.op, r.algorithm, r.nbytes) for r in comm.records], param_bytes, same


def test_watch_ddp_records_each_bucket_once_and_keeps_gradients():
    for records, param_bytes, same in launch(ddp_buckets, world_size=2):
        assert same
        assert records and all(op == "all_reduce" and a == "ddp bucket" for op, a, _ in records)
        assert sum(nbytes for _, _, nbytes in records) == param_bytes


def test_fit_alpha_beta_recovers_the_line_it_was_made_from():
    alpha, beta = 30e-6, 1 / 2e9  # 30 us per message, 2 GB/s
    sizes = [2**k for k in range(10, 27, 2)]
    wobble = [1.03, 0.98, 1.01, 0.97, 1.02, 1.0, 0.99, 1.02, 0.98]  # +-3 % measurement noise
    times = [(alpha + s * beta) * w for s, w in zip(sizes, wobble)]
    fitted_alpha, fitted_beta = fit_alpha_beta(sizes, times)
    assert math.isclose(fitted_alpha, alpha, rel_tol=0.1)
    assert math.isclose(fitted_beta, beta, rel_tol=0.05)


def test_time_ops_gives_every_rank_the_slowest_ranks_time():
    sizes = [1 << 10, 1 << 14]
    per_rank = launch(time_ops, ["ring step", "ring all_reduce"], sizes, 2, world_size=2)
    assert per_rank[0] == per_rank[1]  # the max over ranks, the same on both
    for seconds in per_rank[0].values():
        assert len(seconds) == len(sizes) and all(0 < t < 10 for t in seconds)
