"""Checks for lesson 10's exercises (`exercises/10_debugging.ipynb`): the two finders of
`dlcourse/debug/` by hand, on real runs.

    check_first_divergence(first_divergence)   the first tensor where a rank's run parts from one
                                               process, rounding not counted
    check_mismatched_call(mismatched_call)     from per-rank collective traces of a hang, the rank
                                               and the call that the others do not make

    runs.py       the traces: real 2-rank runs with a bug of the catalogue, a real 4-rank job
    divergence.py, hang.py   the two checks
    reference.py  the answers, from the lesson's own finders, after the student's function returns
    refusal.py    what is refused while a student's code runs

Every check draws its cases afresh on each run and names the seed with a failure; `seed=`
draws the same cases again.
"""

from dlcourse.checks.debugging.divergence import check_first_divergence
from dlcourse.checks.debugging.hang import check_mismatched_call

__all__ = ["check_first_divergence", "check_mismatched_call"]
