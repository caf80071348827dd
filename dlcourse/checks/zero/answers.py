"""What lesson 05's checks (`dlcourse/checks/zero/`) refuse while a student's code runs.

The answers are the lesson's own ZeRO code, every public function and class defined in a module
of `dlcourse.parallel.zero`, and torch's: `ZeroRedundancyOptimizer` (stage 1), `fully_shard`
(FSDP2, stage 3) and `FullyShardedDataParallel`; all refused however they are reached
(`core/answers.py`); and the functions of these check modules, the
answer keys (`padded_shard`, `measured_bytes`, ...). Under `dlcourse grade` a rank loads only
`in_rank.py` (`rank_side`): the lesson's code and the references are absent from it.
"""

from dlcourse.checks.core.answers import Answers

# The lesson's ZeRO code, torch's (ZeroRedundancyOptimizer, stage 1; FSDP2's fully_shard and
# FullyShardedDataParallel, stage 3) and the checks' own references (`padded_shard`, ...).
ANSWERS = Answers(
    packages=("dlcourse.parallel.zero",),
    torch=(("torch.distributed.optim", "ZeroRedundancyOptimizer"),
           ("torch.distributed.fsdp", "fully_shard"),
           ("torch.distributed.fsdp", "FullyShardedDataParallel")),
    checks=("dlcourse.checks.zero",),
    rank_side=("dlcourse.checks.zero.in_rank",))  # a graded rank loads only this
