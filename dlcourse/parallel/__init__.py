"""Parallel training strategies, one subpackage each; every one takes a plain model and the
process group of its axis, never a global. `grid.py`'s RankGrid is built once and handed down,
so that a strategy takes `groups.dp` or `groups.tp`, and `rules.py` is the one rule book of a grid
that the runtime and the planner both call; `timeline.py` records what each rank did,
and when. The catalogue (`dlcourse.strategies`) declares each strategy once for the tour, the
divergence finder and the benchmarks.

Its modules, by lesson (from the course's index, `dlcourse.lessons`):
"""

from dlcourse.lessons import listing

__doc__ += "\n" + listing(__name__) + "\n"
