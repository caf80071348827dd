"""Collectives on real ranks (lesson 02, `lessons/02_collectives.ipynb`).

    ring.py     ring reduce-scatter, all-gather and all-reduce, from send/recv
    tree.py     binomial-tree broadcast and reduce; the naive all-reduce through one root
    cost.py     the alpha-beta model, nccl-tests' algbw/busbw, fitting alpha and beta
    bus.py      nccl-tests' bus factors: what one rank's link carries, op by op
    counter.py  CommCounter: what a rank sends, op by op (lesson 02; lessons 03-07 count with it)
    measure.py  timing ops on ranks: the lesson's curves and benchmarks/collectives.py
    demo.py     each collective's before and after, and a ring step by step, for the figures
    p2p.py      the pieces they share: group ranks, one exchange of messages, ReduceOp

The alpha-beta model's names (`predict_time`, `ALGORITHMS`, ...) are `cost.py`'s, loaded the
first time one is asked for (`__getattr__`): the counter and the rings do not need it, and a
graded rank of lesson 02's cost exercise, whose answer it is, has no `cost.py` at all
(`dlcourse/grading/absent.py`), yet loads this package for the counter.
"""

import importlib

from dlcourse.collectives.bus import BUS_FACTOR, bus_factor
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

# name -> the module of this package that defines it, imported when the name is first asked for
_LOADED_WHEN_ASKED = {name: "cost" for name in (
    "ALGORITHMS", "algbw", "busbw", "fit_alpha_beta", "predict_time")}


def __getattr__(name):
    """`dlcourse.collectives.predict_time` and `from dlcourse.collectives import predict_time`:
    looked up in `cost.py` each time, never bound here (PEP 562)."""
    if name not in _LOADED_WHEN_ASKED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LOADED_WHEN_ASKED[name]}"), name)


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
