"""What lesson 05's checks (`zero.py`) refuse while a student's code runs.

The answers are the lesson's own ZeRO code, every public function and class defined in a module
of `dlcourse.parallel.zero`, and torch's: `ZeroRedundancyOptimizer` (stage 1), `fully_shard`
(FSDP2, stage 3) and `FullyShardedDataParallel`; all refused however they are reached
(`answers.py`).
"""

from dlcourse.checks import answers

PACKAGE = "dlcourse.parallel.zero"
WHY = "it is the lesson's answer to this exercise; write it yourself"
# torch's ZeRO and FSDP, by the modules that bind them: (module, attribute).
TORCH_ANSWERS = [
    ("torch.distributed.optim", "ZeroRedundancyOptimizer"),
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.fsdp", "FullyShardedDataParallel"),
]


def library_answers():
    """[(name, object)]: the public functions and classes defined in dlcourse.parallel.zero's
    modules (none while the package does not exist), then torch's ZeRO and FSDP."""
    return answers.library_answers(PACKAGE, TORCH_ANSWERS)


def refusing_zero(namespaces=(), extra=()):
    """While active, every library answer (and each of `extra`, [(name, object)]) raises
    ForbiddenCall however it is reached (`answers.py`). Yields `refuse.replaced`'s `Refused`,
    which finds copies of a refused function."""
    return answers.refusing_answers(library_answers() + list(extra), WHY, namespaces)


def refuse_zero_library():
    """`run_on_ranks(guard=refuse_zero_library)`: the answers refused in the rank."""
    return refusing_zero()
