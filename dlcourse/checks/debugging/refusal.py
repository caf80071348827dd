"""What lesson 10's checks refuse while a student's code runs, declared once to the checks' engine
(`dlcourse/checks/core/answers.py`): every public function and class of the lesson's tool
`dlcourse.debug` (the divergence finder and `compare_trace`, the hang finder, `CommTrace`, the
catalogue's runs; classes through constructors and methods), lesson 04's one all-reduce of
sequence parallelism's partial gradients (`dlcourse.parallel.tensor.grads`, the fix of the third
exercise), and these checks' own code (the references in `reference.py`, the recorded runs);
for the fifth exercise lesson 06's `sync_tied_grads` too (`TIED_ANSWERS`); for the sixth torch's
analyser of flight-recorder dumps (`FLIGHT_ANSWERS`).
"""

from dlcourse.checks.core.answers import Answers

# A graded rank loads the set's rank side and the catalogue's runs it needs (refused there while
# the student's code runs); the finders, lesson 04's fix and the references are absent from it.
DEBUGGING = Answers(packages=("dlcourse.debug", "dlcourse.parallel.tensor.grads"),
                    checks=("dlcourse.checks.debugging",), keep_classes=True,
                    rank_side=("dlcourse.checks.debugging.in_rank", "dlcourse.debug.bugs",
                               "dlcourse.debug.subjects", "dlcourse.debug.capture"))


def refusing_debugging(namespaces=()):
    """While active, every answer raises ForbiddenCall however it is reached."""
    return DEBUGGING.refusing(namespaces)


def debugging_guard_for(fn):
    """`call_in_process(guard=...)`: the answers refused, the student's globals included."""
    return DEBUGGING.in_process(fn)


# The fifth exercise's answer more: lesson 06's exchange of the tied embedding's gradients, and
# the helper that finds its two copies (`dlcourse.parallel.pipeline.stages`).
TIED_ANSWERS = DEBUGGING.but(single=(("dlcourse.parallel.pipeline.stages", "sync_tied_grads"),
                                     ("dlcourse.parallel.pipeline.stages", "tied_ends")),
                             # the pipeline's own stages run in the rank: refused, not absent
                             rank_side=DEBUGGING.rank_side + ("dlcourse.parallel.pipeline.stages",))


def refusing_tied():
    """`run_on_ranks(guard=...)` for `check_sync_tied_grads`: the answers above refused too."""
    return TIED_ANSWERS.refusing()


# The sixth exercise's answer more: torch's own analyser of flight-recorder dumps (fr_trace and
# the modules that match the ranks' entries).
FLIGHT_ANSWERS = DEBUGGING.but(torch=("torch.distributed.flight_recorder.fr_trace",
                                      "torch.distributed.flight_recorder.components.builder",
                                      "torch.distributed.flight_recorder.components.utils"))
