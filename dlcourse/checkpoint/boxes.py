"""Which part of a whole tensor a shard holds, as boxes (lesson 11, `lessons/11_checkpoints.ipynb`).

A box is (offsets, sizes): the shard element [i, j] is the whole tensor's [o0 + i, o1 + j]. torch's
DCP describes every saved chunk this way (`ChunkStorageMetadata(offsets, sizes)`,
distributed/checkpoint/metadata.py). A tensor-parallel shard is one box per part along its dim; a
ZeRO shard is a range of the flattened tensor, which is up to 2 boxes per dim: the rest of a
partial first row, whole rows, the start of a last row:

    (4, 6) tensor, flat range [9, 20):   row 1 cols 3..5 | rows 2 | row 3 cols 0..1
                                         ((1,3),(1,3))     ((2,0),(1,6))  ((3,0),(1,2))
"""

import math


def flat_boxes(shape, start, end):
    """The boxes that make up elements [start, end) of a row-major tensor of `shape`, in order."""
    shape = tuple(shape)
    if start >= end:
        return []
    if len(shape) <= 1:
        return [((start,), (end - start,))] if shape else [((), ())]
    inner = math.prod(shape[1:])  # elements in one row (a slice along dim 0)
    boxes, rest = [], [0] * (len(shape) - 1)
    boundary = -(-start // inner) * inner  # the first row start at or after `start`
    if start < boundary:  # the rest of a partial first row
        row, stop = start // inner, min(end, boundary)
        boxes += _in_row(shape, row, start - row * inner, stop - row * inner)
        start = stop
    rows = (end - start) // inner
    if rows:  # whole rows
        boxes.append(((start // inner, *rest), (rows, *shape[1:])))
        start += rows * inner
    if start < end:  # the start of a last row
        row = start // inner
        boxes += _in_row(shape, row, 0, end - row * inner)
    return boxes


def _in_row(shape, row, start, end):
    return [((row, *o), (1, *s)) for o, s in flat_boxes(shape[1:], start, end)]


def dim_boxes(shape, dim, rank, world_size, parts=1):
    """[(box, local offset along dim)] of a tensor-parallel shard (lesson 04's `layers.shard`): the
    tensor cut into `parts` along `dim` (q, k, v), each part cut into world_size, rank's pieces
    side by side."""
    part = shape[dim] // parts
    chunk = part // world_size
    out = []
    for i in range(parts):
        offsets = [0] * len(shape)
        sizes = list(shape)
        offsets[dim], sizes[dim] = i * part + rank * chunk, chunk
        out.append(((tuple(offsets), tuple(sizes)), i * chunk))
    return out


def intersect(a, b):
    """The box both `a` and `b` cover, or None."""
    offsets, sizes = [], []
    for (oa, sa), (ob, sb) in zip(zip(*a), zip(*b)):
        lo, hi = max(oa, ob), min(oa + sa, ob + sb)
        if lo >= hi:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return tuple(offsets), tuple(sizes)


def local_slice(tensor, box, origin):
    """The view of `tensor` (holding the box that starts at `origin`) that holds `box`."""
    for d, (o, s, start) in enumerate(zip(*box, origin)):
        tensor = tensor.narrow(d, o - start, s)
    return tensor


def numel(box):
    return math.prod(box[1])
