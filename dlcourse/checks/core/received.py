"""What a rank received from the others, counted by the kernel on its connections, outside the
student's process (`run_on_ranks(received={})`, `grading/wire.py`), held between two bounds:
- `expect_received_data`: no more than the exercise's data and HEADER_ROOM a peer for gloo's
  headers, and (with `least`) no less than the data: whole tensors where a chunk belongs, or a
  file and a token message, fail, whatever the rank's own counter says;
- `wire_floor_units`: how big a check's wide case must be (WIRE_FLOOR bytes or more a peer), so
  that data a rank did not need stands clear of the headers;
- `torch_received`: where the exercise's messages are torch's collectives, whose bytes on the
  wire are gloo's algorithm's (its reduce-scatter receives about as much as an all-reduce), what
  torch's own collectives receive on the same ranks and tensors: the data to bound by.
A check calls these after its own messages, which say more, have had their say.
"""

import warnings

import torch.distributed as dist

from dlcourse.checks.core.ranks import (CHECK_TIMEOUT_S, HEADER_ROOM, WIRE_FLOOR,  # noqa: F401
                                        expect_received_at_least, expect_received_at_most)
from dlcourse.launcher import PerRank, launch_watched


def expect_received_data(received, data, where, hint="", least=None, peers=None):
    """Each rank received at most `data[rank]` bytes, what the exercise must bring it, and
    HEADER_ROOM from each rank that talks to it for gloo's headers (`expect_received_at_most`;
    `peers[rank]` of them, every other rank by default), and, with `least`, at least
    `least[rank]`: both bounds of a check whose messages are its data, read after the check's
    own messages (which say more) have had their say. Give one case WIRE_FLOOR bytes or more a
    peer (`wire_floor_units`), where data a rank did not need stands clear of the room and a
    token message falls short of the floor."""
    __tracebackhide__ = True
    expect_received_at_least(received, least, where, hint)
    peers = peers or [len(data) - 1] * len(data)
    expect_received_at_most(received, [d + HEADER_ROOM * n for d, n in zip(data, peers)],
                            where, hint)


def wire_floor_units(nbytes):
    """How many pieces of `nbytes` bytes make WIRE_FLOOR or more: a wide case's size."""
    return -(-WIRE_FLOOR // max(1, nbytes))


def torch_received(job, rank_args, ways=(None,), timeout=CHECK_TIMEOUT_S):
    """[per rank: bytes received from the others] while `job(*rank_args[r], way)` runs on rank
    r of len(rank_args) gloo ranks, the most over `ways`: `job` is a module-level function of
    the check's that makes torch's own collectives on this rank's tensors (the answer's
    messages), `way` one of the ways torch offers to make them (a list's all_gather or
    all_gather_into_tensor: gloo moves them differently, by a few KiB at 4 ranks), each counted
    by the kernel in a launch of its own, as a student's ranks are. No student code in it."""
    most = [0] * len(rank_args)
    for way in ways:
        counted = {}
        launch_watched(_run, job, PerRank(rank_args), way, world_size=len(rank_args),
                       backend="gloo", timeout=timeout, wire=counted.update)
        most = [max(m, counted.get(rank, 0)) for rank, m in enumerate(most)]
    return most


def _run(job, args, way):
    with warnings.catch_warnings():  # torch 2.13 calls reduce_scatter_tensor deprecated
        warnings.simplefilter("ignore", FutureWarning)
        job(*args, way)
    dist.barrier()  # every rank's messages in before any count is read
