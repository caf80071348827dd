"""What lesson 09's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): the lesson's own code, every public function and
class of `dlcourse.moe`, `dlcourse.moe_experts` and `dlcourse.parallel.expert` (their classes
through constructors, `apply` and methods), the course's MoE GPT and parameter count (`MoEGPT`, `count_params`, which
counts a `MoEConfig`), and these checks' own code (the references in `reference.py`).
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.moe", "dlcourse.moe_experts", "dlcourse.parallel.expert"),
    single=(("dlcourse.models", "MoEGPT"), ("dlcourse.memory.accounting", "count_params"),
            ("dlcourse.memory.accounting", "param_shapes")),
    checks=("dlcourse.checks.expert",), keep_classes=True,
    rank_side=("dlcourse.checks.expert.in_rank",))  # a graded rank loads only this
