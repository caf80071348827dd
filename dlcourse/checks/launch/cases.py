"""Lesson 00's cases: each check's fixed cases (an odd world size, odd lengths, an integer dtype,
so that a function that assumes 4 ranks, a flat x, or float32 buffers fails somewhere) come with
one more drawn at random here, and every tensor's values are drawn afresh.
"""

import torch

from dlcourse.checks.core import dtype_name


DTYPES = (torch.float32, torch.float64, torch.int64)
# And one case of 8 KiB a rank (issue 36): what each rank received, counted by the kernel
# outside it (`core.received`), is bounded by what torch's own all_gather or reduce of the same
# tensors receives; tensors of a few bytes would hide any excess under gloo's message headers.
WIDE_CASE = (4, (1024,), torch.float64)


def drawn_case(rng):
    """(world_size, shape, dtype) at random: 2-4 ranks, 1-3 dimensions of 1-6 elements."""
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
    return rng.randint(2, 4), shape, rng.choice(DTYPES)


def describe_cases(cases):
    return "; ".join(f"{ws} ranks, {dtype_name(dtype)} {tuple(shape)}"
                     for ws, shape, dtype in cases)
