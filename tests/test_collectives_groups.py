"""The course's collectives (lesson 02) on subgroups, their in-place contract, and their errors."""

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

GROUPS = [[1, 3], [0, 2, 3]]  # ranks of the default group; the second is not contiguous


def launch(fn, *args, world_size):
    return dlcourse.launch(fn, *args, world_size=world_size, backend="gloo", timeout=20)


def values(numel, salt=0):
    g = torch.Generator().manual_seed(10 * dist.get_rank() + salt)
    return torch.randint(-4, 5, (numel,), generator=g).float()


def raised(call):
    """The message of the ValueError that call() raises (in a rank, where pytest is not loaded)."""
    try:
        call()
    except ValueError as error:
        return str(error)
    return "no error raised"


def subgroup_cases():
    """Each course collective on each subgroup against torch's op on the same subgroup."""
    groups = [dist.new_group(ranks) for ranks in GROUPS]  # every rank creates every group
    bad = []
    for ranks, group in zip(GROUPS, groups):
        if dist.get_rank() not in ranks:
            continue
        n, rank, root = len(ranks), dist.get_rank(group), ranks[-1]
        x = values(11)  # 11 elements: uneven over 2 and 3 ranks
        for name, ours, theirs in [
            ("ring_all_reduce", lambda t: ring_all_reduce(t, group=group),
             lambda t: dist.all_reduce(t, group=group)),
            ("naive_all_reduce", lambda t: naive_all_reduce(t, group=group),
             lambda t: dist.all_reduce(t, group=group)),
            ("tree_all_reduce", lambda t: tree_all_reduce(t, group=group),
             lambda t: dist.all_reduce(t, group=group)),
            ("tree_broadcast", lambda t: tree_broadcast(t, root, group=group),
             lambda t: dist.broadcast(t, root, group=group)),
        ]:
            got, expected = x.clone(), x.clone()
            ours(got)
            theirs(expected)
            bad += [f"{name} on {ranks}"] if not torch.equal(got, expected) else []
        got, expected = x.clone(), x.clone()
        tree_reduce(got, root, group=group)
        dist.reduce(expected, root, group=group)
        bad += [f"tree_reduce on {ranks}"] if dist.get_rank() == root and not torch.equal(
            got, expected) else []
        inputs = [values(4 + c, salt=c) for c in range(n)]
        got, expected = torch.empty(4 + rank), torch.empty(4 + rank)
        ring_reduce_scatter(got, inputs, group=group)
        dist.reduce_scatter(expected, [t.clone() for t in inputs], group=group)
        bad += [f"ring_reduce_scatter on {ranks}"] if not torch.equal(got, expected) else []
        gathered, expected = [torch.empty(5) for _ in range(n)], [torch.empty(5) for _ in range(n)]
        ring_all_gather(gathered, x[:5].clone(), group=group)
        dist.all_gather(expected, x[:5].clone(), group=group)
        bad += [f"ring_all_gather on {ranks}"] if not torch.equal(
            torch.stack(gathered), torch.stack(expected)) else []
    return bad


def test_subgroups_equal_torch():
    assert launch(subgroup_cases, world_size=4) == [[]] * 4


def outsider_error():
    group = dist.new_group([0, 1])
    if dist.get_rank() != 2:
        return ""
    return raised(lambda: ring_all_reduce(torch.ones(4), group=group))


def test_a_rank_outside_the_group_is_told_so():
    message = launch(outsider_error, world_size=3)[2]
    assert "rank 2 is not in the group" in message and "[0, 1]" in message


def in_place_cases():
    """Which tensors each op writes, and that it writes into them rather than rebinding them."""
    rank, n = dist.get_rank(), dist.get_world_size()
    bad = []
    t = values(10)
    pointer = t.data_ptr()
    if ring_all_reduce(t) is not None or t.data_ptr() != pointer:
        bad.append("ring_all_reduce must work in place and return None, like dist.all_reduce")
    whole = values(4 * n)
    original = whole.clone()
    out = torch.zeros(4)
    pointer = out.data_ptr()
    ring_reduce_scatter_tensor(out, whole)
    bad += ["ring_reduce_scatter_tensor changed its input"] if not torch.equal(whole, original) else []
    bad += ["ring_reduce_scatter_tensor must write into output"] if out.data_ptr() != pointer else []
    mine = values(3)
    kept = mine.clone()
    gathered = torch.empty(n * 3)
    ring_all_gather_into_tensor(gathered, mine)
    bad += ["ring_all_gather_into_tensor changed its input"] if not torch.equal(mine, kept) else []
    bad += ["ring_all_gather_into_tensor: own slot"] if not torch.equal(
        gathered[3 * rank: 3 * rank + 3], mine) else []
    t = values(6)
    pointer = t.data_ptr()
    tree_broadcast(t, 0)
    bad += ["tree_broadcast must write into its tensor"] if t.data_ptr() != pointer else []
    return bad


def test_in_place_contract_is_torchs():
    assert launch(in_place_cases, world_size=3) == [[]] * 3


def error_messages():
    """The message each bad call raises, on a group of 2."""
    rank = dist.get_rank()
    calls = {
        "list length": lambda: ring_all_gather([torch.empty(2)] * 3, torch.ones(2)),
        "output shape": lambda: ring_reduce_scatter(torch.empty(5), [torch.ones(2)] * 2),
        "not contiguous": lambda: ring_all_reduce(torch.ones(4, 4).t()),
        "op": lambda: ring_all_reduce(torch.ones(4), op=dist.ReduceOp.BAND),
        "src": lambda: tree_broadcast(torch.ones(2), src=5),
        "tensor sizes": lambda: ring_reduce_scatter_tensor(torch.empty(3), torch.ones(5)),
        "dtypes": lambda: ring_all_gather([torch.empty(1), torch.empty(1, dtype=torch.float64)],
                                          torch.ones(1) if rank == 0 else torch.ones(1).double()),
    }
    return {name: raised(call) for name, call in calls.items()}


def test_bad_input_gets_an_error_that_says_what_to_do():
    messages = launch(error_messages, world_size=2)[0]
    assert "one tensor per rank of the group (2), got 3" in messages["list length"]
    assert "output must be shaped like input_list[0]" in messages["output shape"]
    assert "t.contiguous()" in messages["not contiguous"]
    assert "ReduceOp." in messages["op"] and "SUM" in messages["op"]
    assert "src=5 is not a rank of the group" in messages["src"]
    assert "world_size x output.numel() = 2 x 3 = 6" in messages["tensor sizes"]
    assert "make them all alike" in messages["dtypes"]
