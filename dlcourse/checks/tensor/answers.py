"""What lesson 04's checks refuse while a student's code runs, declared once to the checks'
engine; the sizes they draw are in `cases.py`.

The answers are the lesson's own tensor-parallel code, every public function and class defined in
a module of `dlcourse.parallel.tensor`, and torch's: DTensor's `parallelize_module`, its
parallel styles and `loss_parallel`; all refused however they are reached, the lesson's
classes through their constructors, `apply` and every method they define
(`core/answers.py`); and the functions of these check modules, the answer keys.
"""

from dlcourse.checks.core.answers import Answers

# The lesson's tensor-parallel code, torch's (DTensor, by the module that binds it) and the
# checks' own references; a class keeps its names, so a student's subclass refuses through them.
ANSWERS = Answers(
    packages=("dlcourse.parallel.tensor",),
    torch=tuple(("torch.distributed.tensor.parallel", name) for name in (
        "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
        "PrepareModuleInput", "PrepareModuleOutput", "loss_parallel")),
    checks=("dlcourse.checks.tensor",),
    allow=("_apply", "_is_function_class", "_not_a_function_class"),  # the harness's, in guard
    keep_classes=True,
    rank_side=("dlcourse.checks.tensor.in_rank",))  # a graded rank loads only this
