"""What one rank's link carries for a collective of S bytes: nccl-tests' bus factors (lesson 02).

nccl-tests (NVIDIA, doc/PERFORMANCE.md) report for an op of S bytes a bus bandwidth, algbw x a
bus factor: the fraction of S that each rank must send over its own link at the least, so that
the figure can be set beside the link's speed whatever the number of ranks. `CommCounter` uses
the same factors to say what a rank moved (`CommRecord.bus_bytes`).

Apart from the alpha-beta model (`cost.py`) because every later lesson counts with the
counter, and lesson 02's cost exercise has `cost.py` for its answer: a graded rank of that
exercise loads the counter without it (`dlcourse/grading/absent.py`).
"""

# op -> bus factor for a group of n ranks (nccl-tests' definitions). An all-reduce must send every
# byte out and bring the result back, less the 1/n share that a rank already holds: 2(n-1)/n.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}


def bus_factor(op, world_size):
    if op not in BUS_FACTOR:
        raise ValueError(f"no bus factor for op {op!r}; known ops: {', '.join(BUS_FACTOR)}")
    return BUS_FACTOR[op](world_size)
