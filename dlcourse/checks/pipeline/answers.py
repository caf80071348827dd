"""What lesson 06's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): every public function and class of
`dlcourse.parallel.pipeline`, everything torch's schedules define, and the functions of these
check modules (the references and simulators: `one_f_one_b`, `_simulated_bubble`, ...).
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.parallel.pipeline",),
    torch=("torch.distributed.pipelining.schedules",
           "torch.distributed.pipelining._schedule_visualizer"),
    checks=("dlcourse.checks.pipeline",),
    why="it computes the answer to this exercise; write it yourself",
    rank_side=("dlcourse.checks.pipeline.in_rank",))  # a graded rank loads only this
