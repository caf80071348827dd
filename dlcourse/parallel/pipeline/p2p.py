"""What neighbouring pipeline stages exchange (lesson 06, `lessons/06_pipeline.ipynb`): the
activations going forward, their gradients coming back, with torch's point-to-point ops.

The order that cannot deadlock: every send is posted with `isend`, which returns at once, and
only receives wait. A rank then blocks only on a message that an earlier action of another rank
has already posted, so any schedule whose actions come after the actions they need runs to the
end. (Both neighbours calling blocking `dist.send` first each wait for the other to receive:
on gloo that hangs even for a 4 KB tensor.)

Each message carries a tag naming the micro-batch, the stage it goes to and its direction, so
a rank may receive messages in another order than its neighbour sent them (interleaved 1F1B
sends activations and gradients of several stages over one pair of ranks).
"""

import torch
import torch.distributed as dist

from dlcourse.collectives.p2p import global_rank

FORWARD, BACKWARD = 0, 1  # an activation going to the next stage, a gradient to the previous


def rank_of_stage(stage, group):
    """Stages are dealt round-robin: stage s lives on pipeline rank s % p (as a global rank)."""
    return global_rank(group, stage % dist.get_world_size(group))


def tag(to_stage, mb, direction, n_stages):
    """A number unique to (receiving stage, micro-batch, direction) within one step."""
    return (mb * n_stages + to_stage) * 2 + direction


def send_activation(y, stage, mb, n_stages, group):
    """Post `stage`'s output y (b, T, h) of micro-batch `mb` to stage + 1; returns the Work."""
    to = stage + 1
    return dist.isend(y.detach().contiguous(), rank_of_stage(to, group), group,
                      tag=tag(to, mb, FORWARD, n_stages))


def recv_activation(shape, dtype, stage, mb, n_stages, group):
    """Wait for stage - 1's output of micro-batch `mb`: this stage's input, (b, T, h)."""
    x = torch.empty(shape, dtype=dtype)
    dist.recv(x, rank_of_stage(stage - 1, group), group, tag=tag(stage, mb, FORWARD, n_stages))
    return x


def send_gradient(dx, stage, mb, n_stages, group):
    """Post dL/d(input of `stage`), (b, T, h), to stage - 1 (its output); returns the Work."""
    to = stage - 1
    return dist.isend(dx.contiguous(), rank_of_stage(to, group), group,
                      tag=tag(to, mb, BACKWARD, n_stages))


def recv_gradient(like, stage, mb, n_stages, group):
    """Wait for dL/d(output of `stage`) of micro-batch `mb` from stage + 1: shaped like `like`."""
    dy = torch.empty_like(like)
    dist.recv(dy, rank_of_stage(stage + 1, group), group, tag=tag(stage, mb, BACKWARD, n_stages))
    return dy


def activation_bytes_sent(batch, seq_len, hidden, n_stages, element_size):
    """Bytes every stage boundary carries per step, all ranks together: each of the n_stages - 1
    boundaries sends the whole batch's activations (B, T, h) forward and as many gradient values
    back, however the batch is cut into micro-batches: 2 (n_stages - 1) B T h x bytes."""
    return 2 * (n_stages - 1) * batch * seq_len * hidden * element_size
