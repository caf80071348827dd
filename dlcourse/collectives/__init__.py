"""Collectives on real ranks (lesson 02, `lessons/02_collectives.ipynb`).

    ring.py     ring reduce-scatter, all-gather and all-reduce, from send/recv
    tree.py     binomial-tree broadcast and reduce; the naive all-reduce through one root
    cost.py     the alpha-beta model, nccl-tests' algbw/busbw, fitting alpha and beta
    counter.py  CommCounter: what a rank sends, op by op (lesson 02; lessons 03-07 count with it)
    measure.py  timing ops on ranks: the lesson's curves and benchmarks/collectives.py
    demo.py     each collective's before and after, and a ring step by step, for the figures
    p2p.py      the pieces they share: group ranks, one exchange of messages, ReduceOp
"""

from dlcourse.collectives.cost import (
    ALGORITHMS,
    BUS_FACTOR,
    algbw,
    bus_factor,
    busbw,
    fit_alpha_beta,
    predict_time,
)
from dlcourse.collectives.counter import CommCounter, CommRecord
from dlcourse.collectives.p2p import exchange, ring_neighbours
from dlcourse.collectives.ring import (
    ring_all_gather,
    ring_all_gather_into_tensor,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_reduce_scatter_tensor,
)
from dlcourse.collectives.tree import naive_all_reduce, tree_all_reduce, tree_broadcast, tree_reduce

__all__ = [
    "ALGORITHMS",
    "BUS_FACTOR",
    "CommCounter",
    "CommRecord",
    "algbw",
    "bus_factor",
    "busbw",
    "exchange",
    "fit_alpha_beta",
    "naive_all_reduce",
    "predict_time",
    "ring_all_gather",
    "ring_all_gather_into_tensor",
    "ring_all_reduce",
    "ring_neighbours",
    "ring_reduce_scatter",
    "ring_reduce_scatter_tensor",
    "tree_all_reduce",
    "tree_broadcast",
    "tree_reduce",
]
