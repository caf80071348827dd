"""The rank side of lesson 02's ring checks: what runs in each rank while a student's ring runs
there. It holds none of the checks' references (torch's results come from a launch of the
check's own, `rings._torch_results`): under `dlcourse grade` this is the one module of the set a
ring's rank loads (`answers.ANSWERS.rank_side`, `grading/absent.py`). The cost exercise keeps
the fallback (`time.TIME_ANSWERS`): its refusals swap the rows of the lesson's cost table in the
rank, so the table's module is loaded there, its file hidden.
"""

from dlcourse.checks.core import ForbiddenCall
from dlcourse.collectives import CommCounter

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
