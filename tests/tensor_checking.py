"""What the tests of lesson 04's checks share: a rank's (tp, rank), and a check's failure read
as a student reads it."""

import re

import torch.distributed as dist

from checking import first_line_and_message, starts


def _tp(group):
    return dist.get_world_size(group), dist.get_rank(group)


def expect_failure(check, answer, exercise, says, hint=""):
    """The check fails on `answer`: first line '<exercise> on N ranks, ...: <says>', the message
    ending with the seed that draws its cases again (`core.fresh_cases`)."""
    first, message = first_line_and_message(check, answer)
    got_hint = message.partition("\n")[2].partition("Hint: ")[2]
    assert re.match(rf"{exercise} on \d ranks, ", first), first
    assert re.search(r"\(cases drawn from seed \d+: ", message), message
    says = says if isinstance(says, tuple) else (says,)
    parts = first.split(": ")[1:]  # after the case, and after "backward: x.grad" if there
    assert any(starts(part, one) for part in parts for one in says), first
    assert hint in got_hint or hint in first, (first, got_hint)
    return first, got_hint
