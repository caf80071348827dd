"""What lesson 02's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): these checks' own functions (the references that run
a ring, the answer keys). The rings' collectives, torch's and the course's, are refused by
`forbid` and seen in the CommCounter's records (`rings.py`); the cost exercise refuses the
lesson's `predict_time` and its table besides (`all_reduce_time.py`).
"""

from dlcourse.checks.core.answers import Answers

# a ring's rank loads only `in_rank.py`
ANSWERS = Answers(checks=("dlcourse.checks.collectives",),
                  rank_side=("dlcourse.checks.collectives.in_rank",))
