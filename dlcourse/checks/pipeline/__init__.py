"""Checks for lesson 06's exercises (`exercises/06_pipeline.ipynb`): a pipeline by hand.

    check_stage_boundaries(stage_boundaries)          balanced stages, the last never the larger
    check_exchange(exchange)                          send to a neighbour and receive from it
    check_last_stage_backward(last_stage_backward)    the loss scaled over the micro-batches
    check_schedule_1f1b(schedule_1f1b)                a rank's 1F1B actions, run on real stages
    check_bubble_fraction(bubble_fraction)            the idle share of a GPipe or 1F1B step
    check_schedule_interleaved(schedule_interleaved)  a rank's interleaved 1F1B actions, simulated

Every check draws its cases afresh on each run (2 to 5 stages on ranks, up to 8 in a formula;
micro-batches, widths, shapes, dtypes; never p = 4 alone) and prints the seed with a failure;
`seed=` draws the same cases again. The 1F1B list and the loss scaling run a schedule on real stages
(`schedule_1f1b.py`); the exchange runs on real ranks; the boundaries and the bubble are formulas,
called here, the bubble compared with a timeline simulated by the check. While the student's code
runs, the course's pipeline package and torch's schedules are refused (`answers.ANSWERS`), and
collectives too where the exercise is point-to-point. One module per exercise, named after it
(`stage_boundaries.py`, `exchange.py`, `last_stage_backward.py`, `schedule_1f1b.py`,
`bubble_fraction.py`, `schedule_interleaved.py`); `stages.py` holds the reference pipeline they
share.
"""

from dlcourse.checks.pipeline.bubble_fraction import check_bubble_fraction
from dlcourse.checks.pipeline.exchange import check_exchange
from dlcourse.checks.pipeline.last_stage_backward import check_last_stage_backward
from dlcourse.checks.pipeline.schedule_1f1b import check_schedule_1f1b
from dlcourse.checks.pipeline.schedule_interleaved import check_schedule_interleaved
from dlcourse.checks.pipeline.stage_boundaries import check_stage_boundaries

__all__ = ["check_stage_boundaries", "check_bubble_fraction", "check_exchange",
           "check_schedule_1f1b", "check_last_stage_backward", "check_schedule_interleaved"]
