"""Lesson 03, exercise 1 (`exercises/03_data_parallel.ipynb`): `check_broadcast_parameters`, every
rank starts from rank 0's weights, when each built its model from its own seed, on 4, 3 and 2
real ranks (the set's guide is `__init__.py`).
"""

from functools import partial

import torch
import torch.distributed as dist

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.checks.core.received import expect_received_data, torch_received
from dlcourse.checks.data.answers import ANSWERS
from dlcourse.checks.data.in_rank import broadcast_in_rank
from dlcourse.checks.data.replicas import MODELS, build, snapshot


BROADCAST_CASES = [(4, "tied GPT"), (3, "MLP with idle parameters"), (2, "MLP")]
BROADCAST_HINT = ("every rank built its model from its own random seed, as separate processes "
                  "do: copy the group's first rank's value into every parameter (frozen ones "
                  "too) on every rank, broadcasting each p.data from it in the same order; "
                  "dist.broadcast names it by its global rank, dist.get_global_rank(group, 0)")


@fresh_cases
def check_broadcast_parameters(broadcast_parameters, timeout=CHECK_TIMEOUT_S, *, rng):
    """broadcast_parameters(model, group) must leave every rank with rank 0's parameters, when
    every rank built its model from a different seed."""
    __tracebackhide__ = True
    expect_callable(broadcast_parameters, "broadcast_parameters")
    cases = BROADCAST_CASES + [(rng.randint(2, 4), rng.choice(list(MODELS)))]
    for W, name in cases:
        where = f"broadcast_parameters on {W} ranks, {name}, each rank from its own seed"
        first = rng.randrange(2**31)  # rank r builds its model from seed first + r
        received = {}  # {rank: bytes}, counted by the kernel, outside the ranks
        outcomes = run_on_ranks(broadcast_parameters, [()] * W, exercise="broadcast_parameters",
                                where=where, hint=BROADCAST_HINT, timeout=timeout,
                                harness=partial(broadcast_in_rank, name, first),
                                guard=ANSWERS.in_rank, received=received)
        starts = [snapshot(build(name, seed=first + r)) for r in range(W)]
        for rank, (weights, _) in enumerate(outcomes):
            _expect_broadcast(weights, starts, rank, where)
        _expect_broadcast_received(received, name, W, where)
    print(f"broadcast_parameters: passed on {len(cases)} cases (4, 3, 2 ranks; tied "
          "GPT, MLP, a frozen parameter), every rank holds rank 0's weights")


def _expect_broadcast_received(received, name, W, where):
    """What each rank received, counted outside it: no more than torch's own broadcasts from
    rank 0 of everything a model could be said to hold (its state_dict, where a tied matrix is
    there twice, and its buffers) and HEADER_ROOM a peer; a rank other than 0 no less than the
    parameters' bytes. Every rank's parameters gathered to keep rank 0's fail on 4 ranks (3
    times the tied GPT's 4 KiB)."""
    __tracebackhide__ = True
    most = torch_received(_broadcast_messages, [(name,)] * W)
    nbytes = sum(p.numel() * p.element_size() for p in build(name).parameters())
    expect_received_data(received, most, where, BROADCAST_HINT,
                         least=[0] + [nbytes] * (W - 1))


def _broadcast_messages(name, way):
    """torch's own broadcast from rank 0 of the model's state_dict and buffers, one by one."""
    model = build(name)
    for t in [*model.state_dict().values(), *model.buffers()]:
        dist.broadcast(t.data, src=0)


def _expect_broadcast(got, starts, rank, where):
    __tracebackhide__ = True
    for name, want in starts[0].items():
        if torch.equal(got[name], want):
            continue
        holder = next((q for q, start in enumerate(starts) if torch.equal(got[name], start[name])),
                      None)
        if holder == rank:
            problem = f"kept its own initial value of {name}: nothing was copied into it"
        elif holder is not None:
            problem = f"holds rank {holder}'s initial value of {name}, not rank 0's"
        else:
            problem = f"holds a value of {name} that is neither its own initial one nor rank 0's"
        fail(where, rank, problem, BROADCAST_HINT)
