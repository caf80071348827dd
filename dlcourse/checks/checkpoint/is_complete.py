"""Check for lesson 11's fourth exercise (`exercises/11_checkpoints.ipynb`):

    check_is_complete(is_complete)

`is_complete(path)` says whether the folder at `path` is a checkpoint that may be loaded: the
course's format (`checkpoint/files.py`), a `step_N` folder with `metadata.json`, whose "files"
maps each rank's file name to its size in bytes. The check saves real checkpoints on 2 or 3 ranks
(`save_checkpoint`, drawn world size and sizes) and tears copies of them the ways a crash does,
in a random order: a save that never committed (a `.tmp` folder), the metadata missing, a rank's
file missing, a file cut short. Complete ones must be accepted and every torn one refused.
"""

import json
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.checkpoint.files import METADATA, save_checkpoint
from dlcourse.checks.checkpoint.answers import ANSWERS
from dlcourse.checks.checkpoint.in_rank import complete_in_rank
from dlcourse.checks.core import (Submitted, call_in_process, expect_callable, fail, fresh_cases,
                                  run_on_ranks)

TEARS = {
    "never committed": "a save cut short leaves a step_N.tmp folder: it never became visible",
    "no metadata": "without its metadata file a checkpoint's save did not finish",
    "a rank's file missing": "every file the metadata lists must be there",
    "a file cut short": "each file must have the size the metadata says it was written with",
}


def _save(root, sizes):
    rank = dist.get_rank()
    save_checkpoint(root, 1, {"w": torch.randn(sizes[rank], dtype=torch.float64)})


def _tear(src, dst, how, rng):
    """A copy of the checkpoint at `src` as `dst`, torn as `how` says; returns its path."""
    if how == "never committed":
        dst += ".tmp"
    shutil.copytree(src, dst)
    with open(os.path.join(dst, METADATA)) as f:
        files = sorted(json.load(f)["files"])
    victim = os.path.join(dst, rng.choice(files))
    if how == "no metadata":
        os.remove(os.path.join(dst, METADATA))
    elif how == "a rank's file missing":
        os.remove(victim)
    elif how == "a file cut short":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) - rng.randrange(1, 64))
    return dst


def _verdict(is_complete, path, where):
    """is_complete(path), in this process for the notebook's self-check; under `dlcourse grade`
    on one rank, whose /tmp is its own: the folder sent to it as data, rebuilt there."""
    __tracebackhide__ = True
    if not isinstance(is_complete, Submitted):
        return call_in_process(is_complete, (path,), exercise="is_complete", where=where,
                               guard=ANSWERS.in_process)
    [(got, _)] = run_on_ranks(is_complete, [(os.path.basename(path), _contents(path))],
                              exercise="is_complete", where=where, harness=complete_in_rank,
                              guard=ANSWERS.in_rank)
    return got


def _contents(path):
    """{path inside `path`: bytes} of every file under the folder."""
    found = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = f.read()
    return found


@fresh_cases
def check_is_complete(is_complete, *, rng):
    """is_complete(path) -> True for a whole checkpoint folder, False for a torn one."""
    __tracebackhide__ = True
    expect_callable(is_complete, "is_complete")
    work = tempfile.mkdtemp(prefix="check_is_complete_")
    try:
        world_size = rng.choice([2, 3])
        sizes = [rng.randrange(1, 200) for _ in range(world_size)]
        dlcourse.launch(_save, work, sizes, world_size=world_size)
        saved = os.path.join(work, "step_000001")
        cases = [("complete", None)] * 2 + [(how, how) for how in TEARS]
        rng.shuffle(cases)
        for i, (label, how) in enumerate(cases):
            path = os.path.join(work, f"copy{i}", f"step_{rng.randrange(2, 999):06d}")
            os.makedirs(os.path.dirname(path))
            path = shutil.copytree(saved, path) if how is None else _tear(saved, path, how, rng)
            where = f"is_complete on a checkpoint of {world_size} ranks ({label})"
            got = _verdict(is_complete, path, where)
            if how is None and got is not True:
                fail(where, None, f"returned {got!r} for a complete checkpoint",
                     "a folder whose metadata lists files that are all there at their sizes is "
                     "complete: return True")
            if how is not None and got is not False:
                fail(where, None, f"returned {got!r}: a torn checkpoint accepted", TEARS[how])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"is_complete: passed (a {world_size}-rank checkpoint accepted twice, and refused torn "
          f"{len(TEARS)} ways: {', '.join(TEARS)})")
