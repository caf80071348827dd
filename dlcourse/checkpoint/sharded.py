"""Sharded checkpoints from scratch: each rank writes its own pieces, one metadata file says which
part of which whole tensor each piece is, and any other layout loads from it (lesson 11,
`lessons/11_checkpoints.ipynb`).

    save_sharded(root, step, zero3_pieces(model, optimizer), group)    # ZeRO-3 on 4 ranks
    load_pieces(path, zero3_pieces(model2, optimizer2))                # ZeRO-3 on 2 ranks

A piece is (name, whole shape, box, tensor): a view of what this rank holds (`boxes.py`). The
names are the plain GPT's, "param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>" and
"adam_step"; the metadata lists, for each name, its whole shape and every saved chunk (file, key,
box). Loading, each wanted box is filled from the saved chunks it overlaps: the reshard is the
intersection of boxes, read from the metadata alone, as DCP's load planner does
(`create_read_items_for_chunk_list`, distributed/checkpoint/planner_helpers.py).
Bytes: a rank of N writes what it holds, (2 + 1)·Ψ·b/N for parameters and AdamW's two moments
(b bytes each, the padding left out), and a rank of M reads (2 + 1)·Ψ·b/M.
"""

import os

import torch
import torch.distributed as dist

from dlcourse.checkpoint import boxes
from dlcourse.checkpoint.files import CheckpointError, read_metadata, save_checkpoint

STATE = ("param", "exp_avg", "exp_avg_sq")  # what is saved of each parameter


def zero3_pieces(model, optimizer):
    """This rank's pieces of lesson 05's ZeroStage3 `model` and its ZeroAdamW: of each unit's
    shard (s values of the padded flat buffer), the range each parameter covers. AdamW's moments
    are created (zeros) if the optimizer has not stepped yet, so a load can fill them."""
    inner, pieces = optimizer.inner, []
    for unit, shard in zip(model.units, model.shards()):
        state = inner.state[shard]
        if not state:  # never stepped: give AdamW its state now, to be filled by a load
            state.update(step=torch.tensor(0.0, dtype=torch.float32),
                         exp_avg=torch.zeros_like(shard), exp_avg_sq=torch.zeros_like(shard))
        held = {"param": shard.data, "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
        offset = 0  # where each parameter starts in the unit's flat buffer
        for name, shape, n in zip(unit.names, unit.shapes, unit.numels):
            lo, hi = max(unit.start, offset), min(unit.end, offset + n)
            if lo < hi:  # this parameter's elements [lo - offset, hi - offset) are in the shard
                for kind, flat in held.items():
                    local = flat[lo - unit.start:hi - unit.start]  # (hi - lo,) a view
                    pieces += _flat_pieces(f"{kind}/{name}", shape, lo - offset, hi - offset, local)
            offset += n
    step = inner.state[model.shards()[0]]["step"]
    return pieces + [("adam_step", (), ((), ()), step)]


def _flat_pieces(name, shape, start, end, local):
    out, used = [], 0
    for box in boxes.flat_boxes(shape, start, end):
        n = boxes.numel(box)
        out.append((name, tuple(shape), box, local[used:used + n].view(box[1])))
        used += n
    return out


def tp_pieces(model, optimizer, tp_group, save_replicated=True):
    """This rank's pieces of a tensor-parallel model (lesson 04's, or lesson 07's TP part) and its
    AdamW: a sharded parameter is a box per part (`boxes.dim_boxes`); a replicated one is whole,
    kept only by tp rank 0 when `save_replicated` is False on the others (no duplicate bytes)."""
    rank, t, pieces = dist.get_rank(tp_group), dist.get_world_size(tp_group), []
    for name, p in model.named_parameters():
        state = optimizer.state[p]
        held = {"param": p.data, "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
        if not hasattr(p, "tp_dim"):
            if save_replicated:
                pieces += [(f"{k}/{name}", tuple(v.shape), ((0,) * v.dim(), tuple(v.shape)), v)
                           for k, v in held.items()]
            continue
        shape = list(p.shape)
        shape[p.tp_dim] *= t  # the whole tensor
        for box, local_start in boxes.dim_boxes(shape, p.tp_dim, rank, t, p.tp_parts):
            size = box[1][p.tp_dim]
            pieces += [(f"{k}/{name}", tuple(shape), box, v.narrow(p.tp_dim, local_start, size))
                       for k, v in held.items()]
    step = next(iter(optimizer.state.values()))["step"]
    return pieces + ([("adam_step", (), ((), ()), step)] if save_replicated else [])


def save_sharded(root, step, pieces, group=None, **commit):
    """Every rank writes its `pieces`; the metadata says where each one lies in its whole tensor.
    Returns (folder, bytes this rank wrote to its file's tensors)."""
    rank = dist.get_rank(group)
    tensors = {f"{i}": t.detach().clone() for i, (_, _, _, t) in enumerate(pieces)}
    mine = [dict(name=n, shape=list(s), offsets=list(b[0]), sizes=list(b[1]), rank=rank, key=f"{i}",
                 dtype=str(t.dtype)) for i, (n, s, b, t) in enumerate(pieces)]
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    table = {}
    for chunks in every:
        for c in chunks:
            entry = table.setdefault(c["name"], dict(shape=c["shape"], dtype=c["dtype"], chunks=[]))
            entry["chunks"].append({k: c[k] for k in ("rank", "key", "offsets", "sizes")})
    path = save_checkpoint(root, step, tensors, group, extra=dict(tensors=table), **commit)
    return path, sum(t.numel() * t.element_size() for t in tensors.values())


def load_pieces(path, pieces):
    """Fill every piece (name, whole shape, box, tensor) of this rank from the checkpoint at
    `path`, whatever layout saved it. Returns the bytes read (copied from the saved chunks)."""
    meta = read_metadata(path)
    if "tensors" not in meta:
        raise CheckpointError(f"{path!r} is a resume state saved by {meta['world_size']} ranks "
                              "(save_checkpoint), not a sharded checkpoint: load it with "
                              f"files.load_rank_state on {meta['world_size']} ranks")
    table, files, read = meta["tensors"], {}, 0
    for name, shape, box, target in pieces:
        entry = _entry(table, name, shape, target.dtype, path)
        filled = 0
        for chunk in entry["chunks"]:
            saved_box = (tuple(chunk["offsets"]), tuple(chunk["sizes"]))
            common = boxes.intersect(box, saved_box) if box[1] else box
            if common is None:
                continue
            source = _file(files, path, chunk["rank"])[chunk["key"]]
            piece = boxes.local_slice(source, common, saved_box[0])
            with torch.no_grad():
                boxes.local_slice(target, common, box[0]).copy_(piece)
            filled += boxes.numel(common)
            read += boxes.numel(common) * source.element_size()
            if not box[1]:
                break  # a scalar: one saved copy is enough
        if filled != boxes.numel(box):
            raise CheckpointError(f"{path!r} holds {filled} of the {boxes.numel(box)} elements of "
                                  f"{name} at {box}: a chunk is missing from its metadata")
    return read


def _entry(table, name, shape, dtype, path):
    """The metadata of `name`, or the one line saying how the checkpoint's model differs."""
    if name not in table:
        raise CheckpointError(f"checkpoint from another model: {path!r} has no {name!r} "
                              f"(it holds {len(table)} tensors, e.g. {next(iter(table))!r})")
    entry = table[name]
    if tuple(entry["shape"]) != tuple(shape):
        raise CheckpointError(f"checkpoint from another model: {name} is {tuple(entry['shape'])} "
                              f"in {path!r}, {tuple(shape)} in this model")
    if entry["dtype"] != str(dtype):  # copy_ would convert silently: not the state that was saved
        raise CheckpointError(f"checkpoint from another model: {name} is {entry['dtype']} in "
                              f"{path!r}, {dtype} in this model")
    return entry


def _file(files, path, rank):
    if rank not in files:  # mmap: only the pages of the chunks copied are read from disk
        files[rank] = torch.load(os.path.join(path, f"rank{rank:05d}.pt"), mmap=True,
                                 weights_only=True)
    return files[rank]


def written_bytes_formula(n_params, world_size, bytes_per_value=8, values_per_param=3):
    """What one rank of `world_size` writes (or reads) of a model of n_params parameters: its
    1/N of the parameters and AdamW's two moments, b bytes each (the padding is not saved)."""
    return values_per_param * n_params * bytes_per_value / world_size
