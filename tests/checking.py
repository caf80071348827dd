"""What the tests of the lessons' checks share: run a check on a wrong answer and read its
message the way a student (and the gradebook) reads it."""

import re

import pytest

from dlcourse.checks.core import CheckFailed

HANG_TIMEOUT_S = 2  # a check's timeout in the hang tests: a deadlock must be reported this fast


def first_line_and_hint(check, *fns, **kwargs):
    """Run check(*fns) expecting CheckFailed; return (its first line, the text after 'Hint: ')."""
    with pytest.raises(CheckFailed) as failed:
        check(*fns, **kwargs)
    message = str(failed.value)
    first, _, rest = message.partition("\n")
    return first, rest.partition("Hint: ")[2]


def fails_on_a_case(check, answer, case, says="", hint=""):
    """check(answer) fails with a first line that starts with `case` (the case it names) and
    holds `says`, and a hint that holds `hint`; returns (first line, hint)."""
    first, got_hint = first_line_and_hint(check, answer)
    assert first.startswith(case) and says in first, first
    assert hint in got_hint, got_hint
    return first, got_hint


def starts(first, says):
    """first starts with says, where "rank ?" in says stands for any rank: when every rank
    fails alike, the message names the first to fail, whichever that is."""
    pattern = re.escape(says).replace(re.escape("rank ?"), r"rank \d")
    return re.match(pattern, first) is not None


def first_line_and_message(check, *fns, **kwargs):
    """Run check(*fns) expecting CheckFailed; return (its first line, the whole message)."""
    with pytest.raises(CheckFailed) as failed:
        check(*fns, **kwargs)
    message = str(failed.value)
    return message.splitlines()[0], message
