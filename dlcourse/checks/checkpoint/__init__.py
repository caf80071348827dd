"""Checks for lesson 11's exercises (`exercises/11_checkpoints.ipynb`), on real gloo ranks:

    check_resume_state(resume_state)      everything a resume needs: the check kills the run after
                                          k steps, restores a fresh one from it, and compares with a
                                          run that never stopped (lesson 10's finder names the gap)
    check_load_my_shard(load_my_shard)    a flat tensor saved in uneven chunks by n ranks, loaded by
                                          m ranks from its metadata alone (n, m, sizes drawn)
    check_checkpoint_interval(checkpoint_interval)
                                          Young's interval and the goodput of a drawn cluster
    check_is_complete(is_complete)        real checkpoints of 2 ranks, some torn by the check

    resume_state.py, load_my_shard.py, checkpoint_interval.py, is_complete.py   the four checks
    answers.py    what is refused while a student's code runs

Every check draws its cases afresh and names the seed with a failure; `seed=` draws them again.
"""

from dlcourse.checks.checkpoint.checkpoint_interval import check_checkpoint_interval
from dlcourse.checks.checkpoint.is_complete import check_is_complete
from dlcourse.checks.checkpoint.load_my_shard import check_load_my_shard
from dlcourse.checks.checkpoint.resume_state import check_resume_state

__all__ = ["check_checkpoint_interval", "check_is_complete", "check_load_my_shard",
           "check_resume_state"]
