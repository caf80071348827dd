"""Lesson 09, exercise 3 (`dlcourse/checks/expert/dispatch_to_experts.py`): the expert-parallel
dispatch on real gloo ranks, 2, 3 and 4 of them, each sent only its own rows. A dispatch written
another way (the list form of all_to_all) passes; sending every row to every rank, swapped split
sizes, an expert's rows reordered, rows sorted by expert, counts that skip idle experts, another
collective and the lesson's own dispatch all fail with a message that says which."""

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint, starts
from dlcourse.checks.expert import check_dispatch_to_experts


def _splits(experts, n_experts, group):
    ep = dist.get_world_size(group)
    counts = torch.bincount(experts, minlength=n_experts)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)
    return counts, received.view(ep, -1)


def dispatch_to_experts(x, experts, n_experts, group):
    ep = dist.get_world_size(group)
    counts, received = _splits(experts, n_experts, group)
    send = counts.view(ep, -1).sum(dim=1).tolist()
    recv = received.sum(dim=1).tolist()
    rows = x.new_empty(sum(recv), x.size(1))
    dist.all_to_all_single(rows, x[torch.sort(experts, stable=True).indices], recv, send,
                           group=group)
    return rows, received


def dispatch_with_lists(x, experts, n_experts, group):  # counts as lists, rows by a loop, numpy
    ep = dist.get_world_size(group)
    n_local = n_experts // ep
    counts = [torch.tensor([int((experts == d * n_local + j).sum()) for j in range(n_local)])
              for d in range(ep)]
    received = [torch.empty(n_local, dtype=torch.int64) for _ in range(ep)]
    dist.all_to_all(received, counts, group=group)  # gloo's list form: equal sizes only
    outgoing = torch.cat([x[experts == e] for e in range(n_experts)])  # by expert, in order
    rows = x.new_empty(int(sum(r.sum() for r in received)), x.size(1))
    dist.all_to_all_single(rows, outgoing, [int(r.sum()) for r in received],
                           [int(c.sum()) for c in counts], group=group)
    return rows.numpy(), torch.stack(received).numpy()  # numpy arrays


def every_row_to_every_rank(x, experts, n_experts, group):
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    n_local = n_experts // ep
    _, received = _splits(experts, n_experts, group)
    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(ep)]
    dist.all_to_all(sizes, [torch.tensor([x.size(0)])] * ep, group=group)
    everyone = x.new_empty(int(sum(sizes)), x.size(1))
    dist.all_to_all_single(everyone, x.repeat(ep, 1), [int(s) for s in sizes],
                           [x.size(0)] * ep, group=group)
    all_experts = torch.empty(int(sum(sizes)), dtype=torch.int64)
    dist.all_to_all_single(all_experts, experts.repeat(ep), [int(s) for s in sizes],
                           [x.size(0)] * ep, group=group)
    rows, start = [], 0
    for s in range(ep):
        mine, start = slice(start, start + int(sizes[s])), start + int(sizes[s])
        for j in range(n_local):
            rows.append(everyone[mine][all_experts[mine] == rank * n_local + j])
    return torch.cat(rows), received


def splits_swapped(x, experts, n_experts, group):
    ep = dist.get_world_size(group)
    counts, received = _splits(experts, n_experts, group)
    send = counts.view(ep, -1).sum(dim=1).tolist()
    recv = received.sum(dim=1).tolist()
    rows = x.new_empty(sum(send), x.size(1))
    dist.all_to_all_single(rows, x[torch.sort(experts, stable=True).indices], send, recv,
                           group=group)
    return rows, received


def not_stable(x, experts, n_experts, group):  # an expert's rows in reverse order
    ep = dist.get_world_size(group)
    counts, received = _splits(experts, n_experts, group)
    key = experts * x.size(0) + torch.arange(x.size(0) - 1, -1, -1)
    rows = x.new_empty(int(received.sum()), x.size(1))
    dist.all_to_all_single(rows, x[key.argsort()], received.sum(dim=1).tolist(),
                           counts.view(ep, -1).sum(dim=1).tolist(), group=group)
    return rows, received


def sorted_by_expert(x, experts, n_experts, group):
    rows, received = dispatch_to_experts(x, experts, n_experts, group)
    ep, n_local = received.shape
    groups = rows.split(received.flatten().tolist())
    return torch.cat([groups[s * n_local + j] for j in range(n_local) for s in range(ep)]), received


def counts_of_chosen_experts_only(x, experts, n_experts, group):  # right while no expert idles
    rows, _ = dispatch_to_experts(x, experts, n_experts, group)
    _, counts = torch.unique(experts, return_counts=True)
    return rows, counts


def with_all_gather(x, experts, n_experts, group):
    sizes = [torch.empty(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, torch.tensor([x.size(0)]), group=group)
    return dispatch_to_experts(x, experts, n_experts, group)


def with_the_lessons_exchange(x, experts, n_experts, group):
    from dlcourse.parallel.expert import exchange_counts
    received = exchange_counts(torch.bincount(experts, minlength=n_experts), group)
    return dispatch_to_experts(x, experts, n_experts, group)[0], received


@pytest.mark.parametrize("answer", [dispatch_to_experts, dispatch_with_lists])
def test_dispatch_to_experts_passes(answer, capsys):
    check_dispatch_to_experts(answer)
    assert "dispatch_to_experts: passed" in capsys.readouterr().out


@pytest.mark.parametrize("answer, says, hint", [
    (every_row_to_every_rank, "bytes (all-to-alls and sends), but its rows are", ""),
    (splits_swapped, "", ""),
    (not_stable, "returned the wrong rows or the right rows in another order", "stable sort"),
    (sorted_by_expert, "returned the wrong rows or the right rows in another order",
     "by source rank, then expert"),
    (counts_of_chosen_experts_only, "returned counts", "an all-to-all of the counts"),
    (with_all_gather, "called dist.all_gather, which this exercise does not allow", ""),
    (with_the_lessons_exchange, "called exchange_counts from dlcourse.parallel.expert.comm", ""),
])
def test_dispatch_to_experts_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_dispatch_to_experts, answer)
    assert starts(first, "dispatch_to_experts on ") and says in first and hint in got_hint, \
        (first, got_hint)
