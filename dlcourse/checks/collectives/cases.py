"""The inputs of lesson 02's three ring checks: the fixed cases every run starts with, and one
more drawn afresh (`ring_reduce_scatter.py`, `ring_all_gather.py`, `ring_all_reduce.py`).
"""

import torch


# (world_size, shape, dtype): the lesson's 4 ranks with even chunks first, then chunks of unequal
# size (tensor_split makes the first numel % n one element longer), fewer elements than ranks
# (an empty chunk), and 2 ranks, where the left and the right neighbour are the same rank.
RING_CASES = [
    (4, (12,), torch.float32),  # chunks of 3, 3, 3, 3
    (4, (10,), torch.float64),  # 3, 3, 2, 2
    (3, (7,), torch.float32),  # 3, 2, 2
    (2, (5,), torch.float64),  # 3, 2
    (4, (3,), torch.float32),  # 1, 1, 1, 0
    (3, (2,), torch.float64),  # 1, 1, 0
]


def drawn_ring_case(rng, matrix=False):
    """(world_size, shape, dtype) at random: 2-4 ranks, 1-20 elements (a matrix if asked)."""
    n, dtype = rng.randint(2, 4), rng.choice((torch.float32, torch.float64))
    if matrix:
        return n, (rng.randint(1, 4), rng.randint(1, 5)), dtype
    return n, (rng.randint(1, 20),), dtype
