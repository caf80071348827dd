"""What lesson 03's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): the lesson's data-parallel code (every public
function and class of `dlcourse.parallel.data`), torch's `DistributedDataParallel`, and these
checks' own references (`whole_batch`, `gradient_at`, ...), the answer keys. Under `dlcourse
grade` a rank loads only `in_rank.py` (`rank_side`): the rest is absent from it.
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.parallel.data",),
    torch=(("torch.nn.parallel", "DistributedDataParallel"),),
    checks=("dlcourse.checks.data",),
    rank_side=("dlcourse.checks.data.in_rank",))  # a graded rank loads only this
