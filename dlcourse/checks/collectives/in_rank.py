"""The rank side of lesson 02's checks: what runs in each rank while a student's ring, or the
cost exercise's formula, runs there. It holds none of the checks' references (torch's results
come from a launch of the check's own, `rings._torch_results`) and imports none of the lesson's
answers: under `dlcourse grade` this is the one module of the set a rank loads
(`answers.ANSWERS.rank_side`, `grading/absent.py`), and the cost exercise's rank has no
`dlcourse.collectives.cost` either (`time.TIME_ANSWERS`).
"""

import contextlib
import importlib

from dlcourse.checks.core import ForbiddenCall
from dlcourse.collectives import CommCounter
from dlcourse.grading import absent

COST = "dlcourse.collectives.cost"  # the alpha-beta model: the cost exercise's answer

# Besides send and recv, a barrier moves no data; `forbid=COLLECTIVES` leaves it too.
ALLOWED_OPS = ("send", "recv", "barrier")
WHY_SEND_RECV = ("the exercise is the ring itself: build it from dist.isend, dist.irecv, "
                 "dist.send and dist.recv (or dist.batch_isend_irecv)")


def sends_and_recvs_only(student, *args):
    """Runs in every rank: the student's function under a CommCounter; any record but send/recv
    is refused. Returns (its value, [(op, peer, nbytes)] of its sends and recvs)."""
    with CommCounter() as comm:
        value = student(*args)
    for record in comm.records:
        if record.op not in ALLOWED_OPS:
            whose = (f"the course's own {record.algorithm} {record.op} from dlcourse.collectives"
                     if record.algorithm else f"torch's {record.op}")
            raise ForbiddenCall(f"used {whose}, which this exercise does not allow: "
                                f"{WHY_SEND_RECV}")
    return value, [(r.op, r.peer, r.nbytes) for r in comm.records if r.op in ("send", "recv")]


class _RefusedRow:
    """Stands in for every row of the cost table while the student's function runs."""

    def __getattr__(self, name):
        raise ForbiddenCall("used dlcourse.collectives.ALGORITHMS, which this exercise does not "
                            "allow: work out the steps and bytes yourself")


@contextlib.contextmanager
def no_cost_table():
    """The rows of the cost table (`cost.ALGORITHMS`, which `predict_time` reads) raise while
    the student's formula runs; then they are put back. A graded rank has no `cost.py`
    (`absent.is_absent`): no table to swap, and none to find."""
    if absent.is_absent(COST):
        yield
        return
    table = importlib.import_module(COST).ALGORITHMS
    rows = dict(table)  # the same dict object everywhere: swap its rows in place
    table.update({name: _RefusedRow() for name in rows})
    try:
        yield
    finally:
        table.update(rows)
