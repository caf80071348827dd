"""What the tests of lesson 04's checks share: a rank's (tp, rank), and a check's failure read
as a student reads it."""

import re

import torch.distributed as dist

from checking import first_line_and_hint, starts


def _tp(group):
    return dist.get_world_size(group), dist.get_rank(group)


def expect_failure(check, answer, exercise, says, hint=""):
    """The check fails on `answer`: first line '<exercise> on N ranks, ... seed S...: <says>'."""
    first, got_hint = first_line_and_hint(check, answer)
    assert re.match(rf"{exercise} on \d ranks, .*seed \d+", first), first
    says = says if isinstance(says, tuple) else (says,)
    parts = first.split(": ")[1:]  # after the case, and after "backward: x.grad" if there
    assert any(starts(part, one) for part in parts for one in says), first
    assert hint in got_hint or hint in first, (first, got_hint)
    return first, got_hint
