"""What lesson 10's checks refuse while a student's code runs, however it is reached
(`dlcourse/checks/answers.py`): every public function and class of the lesson's tool
`dlcourse.debug` (the divergence finder and `compare_trace`, the hang finder, `CommTrace`, the
catalogue's runs; classes through constructors and methods), lesson 04's one all-reduce of
sequence parallelism's partial gradients (`dlcourse.parallel.tensor.grads`, the fix of the third
exercise), and these checks' own answers (`reference.py`).
"""

from dlcourse.checks import answers

PACKAGES = ("dlcourse.debug", "dlcourse.checks.debugging.reference",
            "dlcourse.parallel.tensor.grads")
WHY = "it is the lesson's answer to this exercise; write it yourself"


def debugging_answers():
    """[(name, object)]: every answer this lesson's checks refuse."""
    return [a for package in PACKAGES for a in answers.library_answers(package)]


def refusing_debugging(namespaces=()):
    """While active, every answer raises ForbiddenCall (`answers.refusing_answers`)."""
    return answers.refusing_answers(debugging_answers(), WHY, namespaces, methods=True)


def debugging_guard_for(fn):
    """`call_in_process(guard=...)`: the answers refused, the student's globals included."""
    return refusing_debugging([getattr(fn, "__globals__", {})])
