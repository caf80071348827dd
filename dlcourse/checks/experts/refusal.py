"""What lesson 09's checks refuse while a student's code runs, declared once to the checks'
engine (`dlcourse/checks/core/answers.py`): the lesson's own code, every public function and
class of `dlcourse.moe`, `dlcourse.moe_experts` and `dlcourse.parallel.expert` (their classes
through constructors, `apply` and methods), the course's MoE GPT and parameter count (`MoEGPT`, `count_params`, which
counts a `MoEConfig`), and these checks' own code (the references in `reference.py`).
"""

from dlcourse.checks.core.answers import Answers

EXPERTS = Answers(
    packages=("dlcourse.moe", "dlcourse.moe_experts", "dlcourse.parallel.expert"),
    single=(("dlcourse.models", "MoEGPT"), ("dlcourse.memory.accounting", "count_params"),
            ("dlcourse.memory.accounting", "param_shapes")),
    checks=("dlcourse.checks.experts",), keep_classes=True,
    rank_side=("dlcourse.checks.experts.in_rank",))  # a graded rank loads only this


def refusing_experts(namespaces=()):
    """While active, every answer raises ForbiddenCall however it is reached."""
    return EXPERTS.refusing(namespaces)


def refuse_experts():
    """`run_on_ranks(guard=refuse_experts)`: the answers refused in the rank."""
    return EXPERTS.in_rank()


def experts_guard_for(fn):
    """`call_in_process(guard=...)`: the answers refused, the student's globals included."""
    return EXPERTS.in_process(fn)
