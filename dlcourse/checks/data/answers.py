"""What lesson 03's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): the lesson's data-parallel code (every public
function and class of `dlcourse.parallel.data`), torch's `DistributedDataParallel`, and these
checks' own references (`whole_batch`, `gradient_at`, ...), the answer keys.
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.parallel.data",),
    torch=(("torch.nn.parallel", "DistributedDataParallel"),),
    checks=("dlcourse.checks.data",))
