"""Checks for lesson 02's exercises (`exercises/02_collectives.ipynb`): the ring, by hand.

    check_ring_reduce_scatter(ring_reduce_scatter)  rank r returns chunk r of the sum over ranks
    check_ring_all_gather(ring_all_gather)          every rank returns every chunk, in rank order
    check_ring_all_reduce(ring_all_reduce)          every rank's tensor becomes the sum, in place
    check_all_reduce_time(all_reduce_time)          the alpha-beta time of a ring all-reduce

The ring checks run the student's function on 4, 3 and 2 real gloo ranks, on lengths that the
world size does not divide (and shorter than it), in float32 and float64, and compare every
rank's result with torch's own collective on the same inputs (and one case of chunks of 2 KiB or
more, `rings.wide_case`, where the bytes each rank received, counted outside it, are bounded
both ways). `rings.py` runs them and holds the student to a ring: send/recv only (torch's
collectives and the course's own rings refused), to one neighbour and from the other, a chunk
per step. A wrong chunk is named with what it holds
instead, and what that says about the ring: one module per exercise (`ring_reduce_scatter.py`,
`ring_all_gather.py`, `ring_all_reduce.py`), their fixed and drawn inputs in `cases.py`.

The cost check (`all_reduce_time.py`) calls the student's function in this process and compares
it with the lesson's `predict_time("ring all_reduce", ...)`, which (with the table it reads)
refuses to run meanwhile.
"""

from dlcourse.checks.collectives.all_reduce_time import check_all_reduce_time
from dlcourse.checks.collectives.ring_all_gather import check_ring_all_gather
from dlcourse.checks.collectives.ring_all_reduce import check_ring_all_reduce
from dlcourse.checks.collectives.ring_reduce_scatter import check_ring_reduce_scatter

__all__ = ["check_ring_reduce_scatter", "check_ring_all_gather", "check_ring_all_reduce",
           "check_all_reduce_time"]
