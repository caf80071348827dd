"""What lesson 11's checks refuse while a student's code runs, declared once to the checks' engine
(`dlcourse/checks/core/answers.py`): the lesson's resume (`checkpoint.resume`: `resume_state`,
`restore`), its checkpoint files (`checkpoint.files`: the completeness check), its reshard
(`checkpoint.sharded`, `checkpoint.boxes`, `checkpoint.reshard`), the kill driver and the torch
API modules, the planner's failure arithmetic (`planner.goodput`, `planner.failures`), torch's DCP
save and load, and
these checks' own code. The run the first exercise saves (`checkpoint.run`: `TrainRun`,
`DataStream`) is not refused: its methods are what a resume calls.
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.checkpoint.resume", "dlcourse.checkpoint.files",
              "dlcourse.checkpoint.sharded", "dlcourse.checkpoint.boxes",
              "dlcourse.checkpoint.reshard", "dlcourse.checkpoint.failures",
              "dlcourse.checkpoint.torch_api", "dlcourse.planner.goodput",
              "dlcourse.planner.failures"),
    torch=("torch.distributed.checkpoint.state_dict_saver",
           "torch.distributed.checkpoint.state_dict_loader"),
    checks=("dlcourse.checks.checkpoint",),
    rank_side=("dlcourse.checks.checkpoint.in_rank",))  # a graded rank loads only this
