"""A checkpoint on disk that is either whole or not there (lesson 11, `lessons/11_checkpoints.ipynb`).

    root/step_000004/            a complete checkpoint: every rank's file, then metadata.json
    root/step_000006.tmp/        a save under way (or cut short by a crash): never loaded

Write, then make visible: every rank writes its file into `step_N.tmp/`; after a barrier rank 0
writes `metadata.json` (each file's name and size, the world size, a layout's table) and
renames the folder to `step_N` (one `os.rename`: atomic on a POSIX file system). A crash at any
moment leaves the previous `step_M` untouched and at worst a `.tmp` folder that `latest` skips.
torch's DCP orders it the same way with one file instead of one folder: every rank writes its
data files, the coordinator gathers their write results and only then writes `.metadata`
(to `.metadata.tmp`, renamed: torch 2.13, distributed/checkpoint/filesystem.py
`FileSystemWriter.finish`, called from state_dict_saver.py's `finish_checkpoint`); its loader
reads `.metadata` first, so a folder without it does not load.
"""

import json
import os
import re
import shutil

import torch
import torch.distributed as dist

METADATA = "metadata.json"
_STEP = re.compile(r"^step_(\d+)$")
_RANK_FILE = re.compile(r"^rank\d{5}\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that must not be loaded: its one line says what is missing or differs."""


def step_dir(root, step):
    return os.path.join(root, f"step_{step:06d}")


def rank_file(rank):
    return f"rank{rank:05d}.pt"


def save_checkpoint(root, step, state, group=None, extra=None, crash_before_commit=None):
    """Every rank of `group` saves its `state` (a dict of tensors and numbers) as step `step`
    under `root`; returns the folder. extra: more fields for the metadata (a layout's).
    crash_before_commit(rank): called after this rank's file is written and before the commit,
    so a test can kill a rank there (lesson 11's crash during a save)."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    final, tmp = step_dir(root, step), step_dir(root, step) + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a save an earlier crash left half done
        os.makedirs(tmp)
    dist.barrier(group)
    torch.save(state, os.path.join(tmp, rank_file(rank)))
    if crash_before_commit is not None:
        crash_before_commit(rank)
    dist.barrier(group)  # every rank's file is on disk: only now may it become visible
    if rank == 0:
        files = {rank_file(r): os.path.getsize(os.path.join(tmp, rank_file(r)))
                 for r in range(world_size)}
        meta = dict(step=step, world_size=world_size, files=files, **(extra or {}))
        with open(os.path.join(tmp, METADATA), "w") as f:
            json.dump(meta, f, indent=1)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)  # the commit: one atomic rename
    dist.barrier(group)
    return final


def read_metadata(path):
    """The metadata of a complete checkpoint folder, or CheckpointError saying what is wrong."""
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint at {path!r}: not a folder; pass a step_N folder "
                              "that save_checkpoint wrote (or latest(root))")
    if path.rstrip("/").endswith(".tmp"):
        raise CheckpointError(f"{path!r} is a save that never finished (a .tmp folder): load the "
                              "previous step instead")
    meta_path = os.path.join(path, METADATA)
    if not os.path.exists(meta_path):
        raise CheckpointError(_not_a_checkpoint(path))
    with open(meta_path) as f:
        meta = json.load(f)
    check_files(path, meta)
    return meta


def _not_a_checkpoint(path):
    """The one line for a folder without metadata: a root of checkpoints, a torn save, or none."""
    steps = complete_steps(path)
    if steps:
        return (f"{path!r} is a folder of checkpoints, not one checkpoint: pass latest(root) or "
                f"one of its step folders (newest: {os.path.basename(step_dir(path, steps[-1]))})")
    if any(_RANK_FILE.match(name) for name in os.listdir(path)):
        return (f"{path!r} has no {METADATA}: the save did not finish; it is torn and must not be "
                "loaded")
    return (f"{path!r} is not a checkpoint: no {METADATA} and no rank files; pass a step folder "
            "that save_checkpoint wrote")


def check_files(path, meta):
    """Every file the metadata lists is there with the size it was written with."""
    for name, size in meta["files"].items():
        full = os.path.join(path, name)
        if not os.path.exists(full):
            raise CheckpointError(f"{path!r} is torn: {name} is missing (the metadata lists "
                                  f"{len(meta['files'])} files)")
        if os.path.getsize(full) != size:
            raise CheckpointError(f"{path!r} is torn: {name} holds {os.path.getsize(full)} bytes, "
                                  f"the metadata says {size}")


def load_rank_state(path, rank, world_size):
    """This rank's state from a complete checkpoint saved by the same number of ranks."""
    meta = read_metadata(path)
    if "tensors" in meta:
        raise CheckpointError(f"{path!r} is a sharded checkpoint (sharded.save_sharded), not a "
                              "resume state: load it with sharded.load_pieces")
    if meta["world_size"] != world_size:
        raise CheckpointError(f"{path!r} was saved by {meta['world_size']} ranks, this job has "
                              f"{world_size}: reshard it (checkpoint.sharded) or launch "
                              f"{meta['world_size']} ranks")
    return torch.load(os.path.join(path, rank_file(rank)), weights_only=True)


def complete_steps(root):
    """The steps under `root` with a complete checkpoint, oldest first (.tmp folders skipped)."""
    if not os.path.isdir(root):
        return []
    steps = sorted(int(m.group(1)) for m in map(_STEP.match, os.listdir(root)) if m)
    return [s for s in steps if os.path.exists(os.path.join(step_dir(root, s), METADATA))]


def latest(root):
    """The folder of the newest complete checkpoint under `root`, or None when there is none."""
    steps = complete_steps(root)
    return step_dir(root, steps[-1]) if steps else None
