"""What lesson 01's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): these checks' own functions (the references). Each
exercise adds the lesson's formula that is its answer (`dlcourse.memory`'s `model_state_bytes`,
...) and refuses building a module, so a formula cannot be measured off a real model
(`calls.py`).
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(checks=("dlcourse.checks.memory",),
                  rank_side=("dlcourse.checks.memory.in_rank",))  # a graded rank loads only this
