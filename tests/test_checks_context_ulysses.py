"""Lesson 08's check of seq_to_heads (`dlcourse/checks/context/seq_to_heads.py`) on real
gloo ranks: each rank must end with its a/cp heads over the whole sequence, moved by all-to-all
(or send/recv) and no more bytes than an all-to-all sends. Other correct ways pass; misplaced
heads or tokens are named by where they came from; an all-gather, by name or built from
send/recv, and the lesson's Ulysses are refused."""

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse.checks.context import check_seq_to_heads


def seq_to_heads(x, group):  # the solution notebook's
    cp = dist.get_world_size(group)
    b, a, n, d = x.shape
    send = x.reshape(b, cp, a // cp, n, d).transpose(0, 1).contiguous()  # (cp, b, a/cp, n, d)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 2, 0, 3, 4).reshape(b, a // cp, cp * n, d)


def with_lists(x, group):  # all_to_all on lists of tensors, then one cat
    cp = dist.get_world_size(group)
    send = [h.contiguous() for h in x.chunk(cp, dim=1)]  # piece j: the heads of rank j
    received = [torch.empty_like(s) for s in send]
    dist.all_to_all(received, send, group=group)
    return torch.cat(received, dim=2)


def with_send_and_recv(x, group):  # the all-to-all from point-to-point ops
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    pieces = [h.contiguous() for h in x.chunk(cp, dim=1)]
    received = [pieces[rank] if j == rank else torch.empty_like(pieces[j]) for j in range(cp)]
    ops = [op for j in range(cp) if j != rank for op in (
        dist.P2POp(dist.isend, pieces[j], j, group), dist.P2POp(dist.irecv, received[j], j, group))]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return torch.cat(received, dim=2).numpy()  # numpy back: fine


def head_by_head(x, group):  # one all-to-all a head: up to 3 messages a peer, the same bytes
    cp = dist.get_world_size(group)
    heads = [with_lists(x[:, i::x.size(1) // cp], group) for i in range(x.size(1) // cp)]
    return torch.stack(heads, dim=1).flatten(1, 2)  # (b, a/cp, s, d), heads back in order


@pytest.mark.parametrize("answer", [seq_to_heads, with_lists, with_send_and_recv, head_by_head])
def test_correct_relayouts_pass(answer, capsys):
    check_seq_to_heads(answer)
    assert "seq_to_heads: passed on 3 cases" in capsys.readouterr().out


def heads_interleaved(x, group):  # rank j gets heads j, j + cp, ...: not consecutive
    cp = dist.get_world_size(group)
    send = [x[:, j::cp].contiguous() for j in range(cp)]
    received = [torch.empty_like(s) for s in send]
    dist.all_to_all(received, send, group=group)
    return torch.cat(received, dim=2)


def tokens_in_the_wrong_order(x, group):  # the received blocks stacked the wrong way
    cp = dist.get_world_size(group)
    b, a, n, d = x.shape
    send = x.reshape(b, cp, a // cp, n, d).transpose(0, 1).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.permute(1, 2, 3, 0, 4).reshape(b, a // cp, cp * n, d)  # token-major


def gathers_everything(x, group):
    whole = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(whole, x, group=group)
    return torch.cat(whole, dim=2).chunk(len(whole), dim=1)[dist.get_rank(group)]


def gathers_by_send_and_recv(x, group):  # every rank sends its whole x to every other
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    whole = [x if j == rank else torch.empty_like(x) for j in range(cp)]
    ops = [op for j in range(cp) if j != rank for op in (
        dist.P2POp(dist.isend, x, j, group), dist.P2POp(dist.irecv, whole[j], j, group))]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return torch.cat(whole, dim=2).chunk(cp, dim=1)[rank].contiguous()


def from_the_lesson(x, group):
    from dlcourse.parallel.context import ulysses
    return ulysses._seq_to_heads(x, group)


@pytest.mark.parametrize("wrong, says, hint", [
    (heads_interleaved, "holds at head", "the right token, the wrong head"),
    (tokens_in_the_wrong_order, "holds at head", "the right head, the tokens out of order"),
    (gathers_everything, "called dist.all_gather, which this exercise does not allow", None),
    (gathers_by_send_and_recv, "bytes to other ranks, where one all-to-all sends",
     "only the heads it will hold"),
    (from_the_lesson, "called _seq_to_heads from dlcourse.parallel.context.ulysses", None),
])
def test_wrong_relayouts_fail_saying_why(wrong, says, hint):
    first, rest = first_line_and_hint(check_seq_to_heads, wrong)
    assert first.startswith("seq_to_heads on ") and says in first, first
    if hint:
        assert hint in rest, rest
