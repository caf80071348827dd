"""What a collective costs: the alpha-beta model and nccl-tests' bandwidths (lesson 02).

alpha-beta: a message of b bytes takes alpha + b * beta seconds (alpha: the fixed cost of one
message, latency; beta: seconds per byte, 1 / link bandwidth). An algorithm that takes `steps`
sequential message steps and moves `bytes_moved` bytes over its busiest link takes

    time = steps * alpha + bytes_moved * beta

nccl-tests report two bandwidths for an op of S bytes taking t seconds (NVIDIA's nccl-tests,
doc/PERFORMANCE.md): algbw = S / t, and busbw = algbw x a bus factor, the fraction of S that each
rank must send over its own link at the least, so that busbw can be set beside the link's speed
whatever the number of ranks (the factors: `bus.py`).
"""

import math
from dataclasses import dataclass

from dlcourse.collectives.bus import bus_factor


def algbw(nbytes, seconds):
    """Algorithm bandwidth in bytes/s: the op's size over its time."""
    return nbytes / seconds


def busbw(op, nbytes, seconds, world_size):
    """Bus bandwidth in bytes/s: algbw x bus factor, comparable to one link's speed."""
    return algbw(nbytes, seconds) * bus_factor(op, world_size)


@dataclass(frozen=True)
class Algorithm:
    """How an algorithm spends steps and bytes, for S bytes on n ranks."""

    name: str
    steps: object  # n -> sequential message steps on the critical path
    bytes_moved: object  # (S, n) -> bytes through the busiest rank's link, one direction

    def time(self, nbytes, world_size, alpha, beta):
        return self.steps(world_size) * alpha + self.bytes_moved(nbytes, world_size) * beta


def _log2(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


# The algorithms built in ring.py and tree.py, as rows of one table (lesson 02 prints it).
ALGORITHMS = {
    a.name: a
    for a in [
        # n - 1 steps of one chunk of S/n each.
        Algorithm("ring reduce_scatter", lambda n: n - 1, lambda s, n: (n - 1) / n * s),
        Algorithm("ring all_gather", lambda n: n - 1, lambda s, n: (n - 1) / n * s),
        # both phases: 2(n-1) steps and 2(n-1)/n x S, nearly independent of n.
        Algorithm("ring all_reduce", lambda n: 2 * (n - 1), lambda s, n: 2 * (n - 1) / n * s),
        # every rank sends its whole tensor to the root, which sends the result back to each:
        # the root's link carries (n-1) x S each way, one message after another.
        Algorithm("naive all_reduce", lambda n: 2 * (n - 1), lambda s, n: 2 * (n - 1) * s),
        # a binomial tree doubles the ranks holding the data each round: log2(n) rounds of S.
        # Not pipelined, so 2 log2(n) x S for an all-reduce. nccl's trees are pipelined
        # double binary trees: pieces of S stream through them, about the ring's bytes per link.
        Algorithm("tree broadcast", _log2, lambda s, n: _log2(n) * s),
        Algorithm("tree reduce", _log2, lambda s, n: _log2(n) * s),
        Algorithm("tree all_reduce", lambda n: 2 * _log2(n), lambda s, n: 2 * _log2(n) * s),
    ]
}


def predict_time(algorithm, nbytes, world_size, alpha, beta):
    """Seconds the alpha-beta model gives `algorithm` (a name in ALGORITHMS) for nbytes on n ranks."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm].time(nbytes, world_size, alpha, beta)


def fit_alpha_beta(nbytes, seconds):
    """Fit time = alpha + nbytes * beta to measured (message size, seconds) pairs.

    Least squares on relative error (each equation divided by its measured time), so that a
    1 KB message counts as much as a 64 MB one; otherwise the large sizes decide alone and alpha
    comes out as noise. Returns (alpha seconds, beta seconds per byte), neither below zero.
    """
    if len(nbytes) != len(seconds) or len(nbytes) < 2:
        raise ValueError("fit_alpha_beta needs two equally long lists of at least 2 points")
    # Normal equations of sum_i ((alpha + b_i beta - t_i) / t_i)^2 -> 2 x 2 linear system.
    w = [1 / t**2 for t in seconds]
    s11 = sum(w)
    s12 = sum(wi * b for wi, b in zip(w, nbytes))
    s22 = sum(wi * b * b for wi, b in zip(w, nbytes))
    r1 = sum(wi * t for wi, t in zip(w, seconds))
    r2 = sum(wi * b * t for wi, b, t in zip(w, nbytes, seconds))
    det = s11 * s22 - s12 * s12
    alpha = (r1 * s22 - r2 * s12) / det
    beta = (s11 * r2 - s12 * r1) / det
    if alpha < 0:  # noise can make the intercept negative: fit the slope alone, through zero
        return 0.0, max(r2 / s22, 0.0)
    return alpha, max(beta, 0.0)
