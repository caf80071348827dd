"""What lesson 10's checks refuse while a student's code runs, declared once to the checks' engine
(`dlcourse/checks/core/answers.py`): every public function and class of the lesson's tool
`dlcourse.debug` (the divergence finder and `compare_trace`, the hang finder, `CommTrace`, the
catalogue's runs; classes through constructors and methods), lesson 04's one all-reduce of sequence
parallelism's partial gradients (`dlcourse.parallel.tensor.grads`, the fix of the third exercise),
and these checks' own code (the references in `reference.py`, the recorded runs); for the fifth
exercise lesson 06's `sync_tied_grads` too (`sync_tied_grads.py`'s `TIED_ANSWERS`); for the sixth
torch's analyser of flight-recorder dumps (`waited_call.py`'s `FLIGHT_ANSWERS`).
"""

from dlcourse.checks.core.answers import Answers

# A graded rank loads the set's rank side and the catalogue's runs it needs (refused there while
# the student's code runs); the finders, lesson 04's fix and the references are absent from it.
ANSWERS = Answers(packages=("dlcourse.debug", "dlcourse.parallel.tensor.grads"),
                  checks=("dlcourse.checks.debug",), keep_classes=True,
                  rank_side=("dlcourse.checks.debug.in_rank", "dlcourse.debug.bugs",
                             "dlcourse.debug.subjects", "dlcourse.debug.capture"))
