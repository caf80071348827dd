"""Lesson 00, exercise 1 (`exercises/00_launch.ipynb`): `check_gather_all`, every rank gets every
rank's tensor, stacked in rank order, compared with a single-process `torch.stack`.
"""

import torch
import torch.distributed as dist

from dlcourse.checks.core import (CHECK_TIMEOUT_S, describe, expect_tensor, expect_unchanged,
                                  fresh_cases, random_tensor, run_on_ranks)
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.launch.cases import WIDE_CASE, describe_cases, drawn_case


# (world_size, shape of x, dtype); each run adds one drawn at random (`cases.drawn_case`)
GATHER_CASES = [(4, (3,), torch.float32), (3, (2, 5), torch.int64), (2, (7,), torch.float64)]


GATHER_HINT = ("make a list of world_size tensors shaped like x with x's dtype "
               "(torch.empty_like), fill it with one dist.all_gather, and torch.stack it: "
               "row r is rank r's x")


@fresh_cases
def check_gather_all(gather_all, timeout=CHECK_TIMEOUT_S, *, rng):
    """gather_all(x) must return, on every rank, the (world_size, *x.shape) stack of every
    rank's x in rank order, and leave x as it was."""
    __tracebackhide__ = True
    cases = GATHER_CASES + [drawn_case(rng), WIDE_CASE]
    for world_size, shape, dtype in cases:
        xs = [random_tensor(shape, dtype, seed=rng.randrange(2**31)) for _ in range(world_size)]
        where = f"gather_all on {world_size} ranks, x: {describe(xs[0])}"
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(gather_all, [(x,) for x in xs], exercise="gather_all",
                                where=where, hint=GATHER_HINT, timeout=timeout,
                                received=received)
        expected = torch.stack(xs)  # (world_size, *shape)
        for rank, (got, (x_after,)) in enumerate(outcomes):
            expect_tensor(got, expected, where=where, rank=rank, hint=GATHER_HINT)
            expect_unchanged(xs[rank], x_after, where=where, rank=rank, name="x", hint=GATHER_HINT)
        most = torch_received(_all_gather, [(torch.zeros_like(xs[0]),)] * world_size)
        expect_received_data(received, most, where, GATHER_HINT)
    print(f"gather_all: passed on {describe_cases(cases)}")


def _all_gather(x, way):
    """torch's own all_gather of every rank's x: the bound on what gather_all receives."""
    dist.all_gather([torch.empty_like(x) for _ in range(dist.get_world_size())], x)
