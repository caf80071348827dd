"""Lesson 06's check of exchange (`dlcourse/checks/pipeline/exchange.py`): the solutions and correct
answers written other ways pass; the wrong answers students write fail with a message naming the
case, the rank and a hint that says which mistake it was. Every run draws new cases, so each
wrong answer here fails on whatever is drawn."""

import pytest
import torch
import torch.distributed as dist

from checking import HANG_TIMEOUT_S, first_line_and_hint, starts
from dlcourse.checks.pipeline import check_exchange


# --- exercise 2: the exchange --------------------------------------------------------------


def exchange(tensor, peer, group):
    received = torch.empty_like(tensor)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, group),
                                    dist.P2POp(dist.irecv, received, peer, group)])
    for work in works:
        work.wait()
    return received


def exchange_isend_recv(tensor, peer, group):
    received = torch.empty_like(tensor)
    sending = dist.isend(tensor, peer, group)
    dist.recv(received, peer, group)
    sending.wait()
    return received


def exchange_lower_rank_sends_first(tensor, peer, group):
    received = torch.empty_like(tensor)
    if dist.get_rank(group) < peer:
        dist.send(tensor, peer, group)
        dist.recv(received, peer, group)
    else:
        dist.recv(received, peer, group)
        dist.send(tensor, peer, group)
    return received


def exchange_both_send_first(tensor, peer, group):
    received = torch.empty_like(tensor)
    dist.send(tensor, peer, group)
    dist.recv(received, peer, group)
    return received


def exchange_into_the_input(tensor, peer, group):
    sending = dist.isend(tensor.clone(), peer, group)
    dist.recv(tensor, peer, group)  # overwrites the caller's activation
    sending.wait()
    return tensor


def exchange_returns_its_own(tensor, peer, group):
    received = torch.empty_like(tensor)
    sending = dist.isend(tensor, peer, group)
    dist.recv(received, peer, group)
    sending.wait()
    return tensor


def exchange_for_two_ranks(tensor, peer, group):  # the other rank is 1 - rank
    return exchange_isend_recv(tensor, 1 - dist.get_rank(group), group)


def exchange_by_all_gather(tensor, peer, group):
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor, group)
    return gathered[peer]


@pytest.mark.parametrize("answer", [exchange, exchange_isend_recv,
                                    exchange_lower_rank_sends_first])
def test_exchange_passes(answer, capsys):
    check_exchange(answer)
    assert "exchange: passed" in capsys.readouterr().out


def test_both_neighbours_sending_first_is_a_deadlock_named_within_seconds():
    first, hint = first_line_and_hint(check_exchange, exchange_both_send_first,
                                      timeout=HANG_TIMEOUT_S)
    assert first.startswith("exchange on 2 ranks") and f"within {HANG_TIMEOUT_S} s" in first
    assert "both neighbours send first" in hint


def test_an_exchange_right_only_on_two_ranks_fails_on_more():
    # 5 s, not the default 10: the 2-rank case (well under 1 s) must finish on a loaded machine
    # too; then a case with more ranks hangs, and waits the whole timeout
    first, _ = first_line_and_hint(check_exchange, exchange_for_two_ranks, timeout=5)
    assert first.startswith("exchange on ") and not first.startswith("exchange on 2 "), first


@pytest.mark.parametrize("answer, says, hint", [
    (exchange_into_the_input, "rank ? changed the tensor it sent", "torch.empty_like"),
    (exchange_returns_its_own, "rank ? got wrong values from the exchange with rank", "empty_like"),
    (exchange_by_all_gather, "rank ? called dist.all_gather, which this exercise does not allow",
     ""),
])
def test_exchange_wrong_answers_fail(answer, says, hint):
    first, got_hint = first_line_and_hint(check_exchange, answer)
    assert first.startswith("exchange on "), first
    assert starts(first.split(": ", 1)[1], says) and hint in got_hint, (first, got_hint)
