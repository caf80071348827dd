"""What lesson 09's checks refuse while a student's code runs, however it is reached
(`dlcourse/checks/answers.py`): the lesson's own code, every public function and class of
`dlcourse.moe` and `dlcourse.parallel.expert` (their classes through constructors, `apply` and
methods), the course's MoE GPT and parameter count (`MoEGPT`, `count_params`, which counts a
`MoEConfig`), and these checks' own references (`reference.py`).
"""

import importlib

from dlcourse.checks import answers

PACKAGES = ("dlcourse.moe", "dlcourse.parallel.expert", "dlcourse.checks.experts.reference")
# (module, attribute): more of the course that holds an answer
MORE = [("dlcourse.models", "MoEGPT"), ("dlcourse.memory.accounting", "count_params"),
        ("dlcourse.memory.accounting", "param_shapes")]
WHY = "it is the lesson's answer to this exercise; write it yourself"


def expert_answers():
    """[(name, object)]: every answer this lesson's checks refuse."""
    found = [a for package in PACKAGES for a in answers.library_answers(package)]
    for module, name in MORE:
        found.append((f"{name} from {module}", getattr(importlib.import_module(module), name)))
    return found


def refusing_experts(namespaces=()):
    """While active, every answer raises ForbiddenCall (`answers.refusing_answers`)."""
    return answers.refusing_answers(expert_answers(), WHY, namespaces, methods=True)


def refuse_experts():
    """`run_on_ranks(guard=refuse_experts)`: the answers refused in the rank."""
    return refusing_experts()


def experts_guard_for(fn):
    """`call_in_process(guard=...)`: the answers refused, the student's globals included."""
    return refusing_experts([getattr(fn, "__globals__", {})])
