"""The course's collectives (lesson 02) against torch's own, on 2, 3 and 4 real ranks.

Inputs are small whole numbers stored as floats: sums, products, minima and maxima of them are
exact in every dtype tested (|sums| <= 4 x 4 = 16, products of four values in -2..2), so the
course's result must equal torch's bit for bit, whatever order either adds in. Only the random
normal AVG case allows rounding (see there). Each rank returns the cases it got wrong; an empty
list on every rank passes.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.collectives import (
    naive_all_reduce,
    ring_all_gather,
    ring_all_gather_into_tensor,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_reduce_scatter_tensor,
    tree_all_reduce,
    tree_broadcast,
    tree_reduce,
)
from dlcourse.collectives import ring as ring_module

ReduceOp = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIZES = [1, 3, 10, 17, 64]  # 17 and 10 split unevenly over 3 and 4 ranks; 1 leaves empty chunks
OPS = [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT]
WORLD_SIZES = [2, 3, 4]


def launch(fn, *args, world_size):
    # A short timeout: a ring that waits for a message nobody sends fails in seconds.
    return dlcourse.launch(fn, *args, world_size=world_size, backend="gloo", timeout=20)


def whole_numbers(shape, dtype, op, salt=0):
    """This rank's input: whole numbers, small enough that any reduction of them is exact."""
    g = torch.Generator().manual_seed(100 * dist.get_rank() + salt)
    low, high = (-2, 3) if op == ReduceOp.PRODUCT else (-4, 5)
    return torch.randint(low, high, shape, generator=g).to(dtype)


def mismatch(name, got, expected):
    """[] when equal, else [where they differ: the first failing element and both values]."""
    if got.shape == expected.shape and torch.equal(got, expected):
        return []
    if got.shape != expected.shape:
        return [f"{name}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"]
    i = (got != expected).flatten().nonzero()[0].item()
    return [f"rank {dist.get_rank()} {name}: element {i} is {got.flatten()[i].item()}, "
            f"expected {expected.flatten()[i].item()}"]


def all_reduce_cases(segment_bytes, ops):
    ring_module.SEGMENT_BYTES = segment_bytes  # this rank's process only: cut chunks into pieces
    bad = []
    for dtype in DTYPES:
        for numel in SIZES:
            for op in ops:
                x = whole_numbers((numel,), dtype, op)
                expected = x.clone()
                dist.all_reduce(expected, op=op)
                got = x.clone()
                ring_all_reduce(got, op=op)
                bad += mismatch(f"ring_all_reduce {dtype} numel={numel} {op}", got, expected)
    x = whole_numbers((3, 5), torch.float32, ReduceOp.SUM)  # any shape: it is flattened
    expected = x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(x)
    return bad + mismatch("ring_all_reduce shape (3, 5)", x, expected)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_reduce_equals_torch(world_size):
    # One message per chunk, then pieces of 8 bytes: the segmented path on small tensors.
    for segment_bytes, ops in ((4 << 20, OPS), (8, [ReduceOp.SUM])):
        bad = launch(all_reduce_cases, segment_bytes, ops, world_size=world_size)
        assert bad == [[]] * world_size


def average_case():
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(1000, dtype=torch.float64, generator=g)
    expected = x.clone()
    dist.all_reduce(expected, op=ReduceOp.AVG)
    ring_all_reduce(x, op=ReduceOp.AVG)
    # Sums of 4 numbers of size ~1 in another order differ by a few ulps of float64 (~1e-16).
    return (x - expected).abs().max().item()


def test_ring_all_reduce_average_equals_torch():
    assert max(launch(average_case, world_size=3)) < 1e-12


def reduce_scatter_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = []
    for dtype in DTYPES:
        for numel in SIZES:
            # List form, uneven: chunk c has numel + c elements.
            inputs = [whole_numbers((numel + c,), dtype, ReduceOp.SUM, salt=c) for c in range(n)]
            originals = [t.clone() for t in inputs]
            expected = torch.empty(numel + rank, dtype=dtype)
            dist.reduce_scatter(expected, [t.clone() for t in inputs])
            got = torch.empty_like(expected)
            ring_reduce_scatter(got, inputs)
            bad += mismatch(f"ring_reduce_scatter {dtype} numel={numel}", got, expected)
            bad += [f"input_list changed ({dtype})"] if not all(
                torch.equal(a, b) for a, b in zip(inputs, originals)) else []
            ring_reduce_scatter(inputs[rank], inputs)  # the output may be its own input chunk
            bad += mismatch(f"ring_reduce_scatter in place {dtype}", inputs[rank], expected)
            # Tensor form: (n * numel, 2) in, (numel, 2) out.
            whole = whole_numbers((n * numel, 2), dtype, ReduceOp.SUM)
            expected = torch.empty(numel, 2, dtype=dtype)
            dist.reduce_scatter_single(expected, whole.clone())
            got = torch.empty_like(expected)
            ring_reduce_scatter_tensor(got, whole)
            bad += mismatch(f"ring_reduce_scatter_tensor {dtype} numel={numel}", got, expected)
    return bad


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_reduce_scatter_equals_torch(world_size):
    assert launch(reduce_scatter_cases, world_size=world_size) == [[]] * world_size


def all_gather_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = []
    for dtype in DTYPES:
        for numel in SIZES:
            # Uneven list form: rank c contributes numel + c elements. gloo's all_gather needs
            # equal sizes, so torch's answer is gathered padded to the longest and cut back.
            mine = whole_numbers((numel + rank,), dtype, ReduceOp.SUM)
            padded = torch.zeros(numel + n - 1, dtype=dtype)
            padded[: mine.numel()] = mine
            gathered = [torch.empty_like(padded) for _ in range(n)]
            dist.all_gather(gathered, padded)
            got = [torch.empty(numel + c, dtype=dtype) for c in range(n)]
            before = mine.clone()
            ring_all_gather(got, mine)
            for c in range(n):
                bad += mismatch(f"ring_all_gather {dtype} numel={numel} [{c}]", got[c],
                                gathered[c][: numel + c])
            bad += mismatch("ring_all_gather changed its input", mine, before)
            # Tensor form: (n * numel,) out of (numel,) each; the course's also stacked, (n, numel).
            expected = torch.empty(n * numel, dtype=dtype)
            dist.all_gather_single(expected, mine[:numel].clone())
            got = torch.empty(n, numel, dtype=dtype)
            ring_all_gather_into_tensor(got, mine[:numel].clone())
            bad += mismatch(f"ring_all_gather_into_tensor {dtype} numel={numel}", got,
                            expected.view(n, numel))
    return bad


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_all_gather_equals_torch(world_size):
    assert launch(all_gather_cases, world_size=world_size) == [[]] * world_size


def tree_and_naive_cases():
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = []
    for dtype in DTYPES:
        for numel in (1, 17):
            for root in range(n):
                x = whole_numbers((numel,), dtype, ReduceOp.SUM, salt=root)
                expected = x.clone()
                dist.broadcast(expected, src=root)
                got = x.clone()
                tree_broadcast(got, src=root)
                bad += mismatch(f"tree_broadcast {dtype} src={root}", got, expected)
                for op in OPS:
                    x = whole_numbers((numel,), dtype, op, salt=root)
                    expected = x.clone()
                    dist.reduce(expected, dst=root, op=op)
                    got = x.clone()
                    tree_reduce(got, dst=root, op=op)
                    # torch defines only dst's result; the course leaves the others unchanged.
                    bad += mismatch(f"tree_reduce {dtype} dst={root} {op}", got,
                                    expected if rank == root else x)
            for name, fn in (("naive_all_reduce", naive_all_reduce),
                             ("tree_all_reduce", tree_all_reduce)):
                for op in OPS:
                    x = whole_numbers((numel,), dtype, op)
                    expected = x.clone()
                    dist.all_reduce(expected, op=op)
                    fn(x, op=op)
                    bad += mismatch(f"{name} {dtype} numel={numel} {op}", x, expected)
    return bad


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tree_and_naive_equal_torch(world_size):
    assert launch(tree_and_naive_cases, world_size=world_size) == [[]] * world_size
