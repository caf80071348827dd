"""Flat buffers cut into N equal shards, padded (lesson 05: `lessons/05_zero.ipynb`).

ZeRO partitions by elements, not by parameters: the parameters of a unit (a gradient bucket, or
a transformer block) are laid end to end in one flat buffer of Ψ_unit values, padded with zeros
to a multiple of N, and rank r owns the r-th of the N equal pieces:

    flat (padded to N * s):  [ p0 ........ | p1 .... | p2 ...... | 0 0 ]
    shards, s values each:   [ rank 0  |  rank 1  |  rank 2  |  rank 3 ]

So every rank holds exactly s = ceil(Ψ_unit / N) values of each partitioned part, whatever the
shapes (torch's ZeroRedundancyOptimizer hands out whole parameters instead: uneven). The padding
(fewer than N values per unit) is never part of a parameter: `views` reads only the first Ψ_unit.
"""

import math

import torch


def shard_numel(numel, world_size):
    """s = ceil(Ψ / N): the values each of N ranks holds of a flat buffer of Ψ values."""
    if world_size < 1 or numel < 0:
        raise ValueError(f"need numel >= 0 and world_size >= 1, got {numel} and {world_size}")
    return math.ceil(numel / world_size)


def shard_bounds(numel, world_size, rank):
    """(start, end) of rank's shard in the padded flat buffer: end - start is always s."""
    s = shard_numel(numel, world_size)
    return rank * s, (rank + 1) * s


class FlatShard:
    """The layout of some parameters in one padded flat buffer, and this rank's piece of it.

    names, params: the unit's parameters, in a fixed order (the same on every rank).
    numel: Ψ_unit; padded: N * s; start, end: this rank's slice of the padded buffer.
    """

    def __init__(self, names, params, world_size, rank):
        self.names, self.params = list(names), list(params)
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.numel = sum(self.numels)
        self.world_size = world_size
        self.shard_numel = shard_numel(self.numel, world_size)
        self.padded = world_size * self.shard_numel
        self.start, self.end = shard_bounds(self.numel, world_size, rank)
        self.dtype, self.device = self.params[0].dtype, self.params[0].device

    @torch.no_grad()  # data, not part of any autograd graph
    def flatten(self, tensors):
        """A new padded flat buffer (padded,) holding `tensors` (shaped like the params) end to
        end; the padding is zeros, so it adds nothing to a sum over ranks."""
        flat = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
        for view, t in zip(self.views(flat), tensors):
            view.copy_(t)
        return flat

    def views(self, flat):
        """One view of `flat` per parameter, shaped like it: the padding is left out."""
        pieces = flat[:self.numel].split(self.numels)
        return [piece.view(shape) for piece, shape in zip(pieces, self.shapes)]

    def my_shard(self, flat):
        """This rank's s values of a padded flat buffer: a view, not a copy."""
        return flat[self.start:self.end]

    def __repr__(self):
        shown = ", ".join(self.names[:3]) + (", ..." if len(self.names) > 3 else "")
        return (f"FlatShard({len(self.params)} params, Ψ={self.numel:,} padded to "
                f"{self.padded:,} = {self.world_size} x {self.shard_numel:,}: {shown})")
