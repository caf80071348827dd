"""Debugging distributed training (lesson 10, `lessons/10_debugging.ipynb`): find the first place
a parallel run parts from one process, and the call on which ranks stop agreeing.

    subjects.py    the catalogue's strategies (`dlcourse.strategies`) as the finder runs them
    capture.py     forward hooks, gradients read before the step, unsharded by the strategy
    compare.py     a rank's trace against the reference's, tensor by tensor
    divergence.py  `find_divergence`: both runs, compared, the first gap and its ranks
    bugs.py        the catalogue: real bugs, each a patch on the course's correct code
    hang.py        `CommTrace` per rank and `find_hang`: the first collective ranks disagree on
    forgetting.py  lesson 11's resume with pieces forgotten, each gap named by the finder
"""

from dlcourse.debug.divergence import (Divergence, Report, find_divergence, find_divergences,
                                       loss_curves)
from dlcourse.debug.hang import CommTrace, find_hang, launch_traced, read_traces
from dlcourse.debug.subjects import SUBJECTS, DebugConfig, Subject

__all__ = ["SUBJECTS", "CommTrace", "DebugConfig", "Divergence", "Report", "Subject",
           "find_divergence", "find_divergences", "find_hang", "launch_traced", "loss_curves",
           "read_traces"]
