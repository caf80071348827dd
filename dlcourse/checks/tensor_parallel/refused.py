"""What lesson 04's checks (`linear.py`, `layers.py`) refuse while a student's code runs, and the
sizes they draw (the seed itself: `core.draw`).

The answers are the lesson's own tensor-parallel code, every public function and class defined in
a module of `dlcourse.parallel.tensor`, and torch's: DTensor's `parallelize_module`, its
parallel styles and `loss_parallel`; all refused however they are reached, the lesson's
classes through their constructors, `apply` and every method they define
(`core/answers.py`); and the functions of these check modules, the answer keys.
"""

from dlcourse.checks.core.answers import Answers

# The lesson's tensor-parallel code, torch's (DTensor, by the module that binds it) and the
# checks' own references; a class keeps its names, so a student's subclass refuses through them.
TENSOR = Answers(
    packages=("dlcourse.parallel.tensor",),
    torch=tuple(("torch.distributed.tensor.parallel", name) for name in (
        "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
        "PrepareModuleInput", "PrepareModuleOutput", "loss_parallel")),
    checks=("dlcourse.checks.tensor_parallel",),
    allow=("_apply", "_is_function_class", "_not_a_function_class"),  # the harness's, in guard
    keep_classes=True,
    rank_side=("dlcourse.checks.tensor_parallel.in_rank",))  # a graded rank loads only this


def wide_seed(rng):
    """A seed for one tensor (`random_tensor`), one of 2**62: a rank that holds one tensor of a
    case cannot find it, and from it the case's other tensors, by trying seeds."""
    return rng.randrange(2**62)


def draw_tp_sizes(rng):
    """2, 3 and 4 in a random order: every run holds a tp that is not 4 (nor a power of 2)."""
    sizes = [2, 3, 4]
    rng.shuffle(sizes)
    return sizes
