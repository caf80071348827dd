"""Lesson 11's exercise checks (`dlcourse/checks/checkpoint/`): each passes a correct answer and
one written another way, fails the wrong answers students write with the hint that names the
mistake, and refuses the lesson's own answer."""

import copy
import json
import math
import os

import pytest
import torch
import torch.distributed as dist

from checking import first_line_and_hint
from dlcourse.checks.checkpoint import (check_checkpoint_interval, check_is_complete,
                                        check_load_my_shard, check_resume_state)

# ---------------------------------------------------------------- exercise 1: the resume state


def resume_state(run):
    return {"model": {k: v.clone() for k, v in run.model.state_dict().items()},
            "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
            "rng": torch.get_rng_state(), "tracker": {k: v.clone() for k, v in run.tracker.states.items()},
            "data": run.data.state_dict()}


def deep_copies(run):  # another way: deep copies, torch.random's name for the generator
    return copy.deepcopy({"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
                          "scheduler": run.scheduler.state_dict(),
                          "rng": torch.random.get_rng_state(), "tracker": run.tracker.states,
                          "data": run.data.state_dict()})


def without(piece):
    def forgetful(run):
        state = resume_state(run)
        del state[piece]
        return state
    return forgetful


def tracker_on_rank_0_only(run):
    state = resume_state(run)
    if dist.get_rank() != 0:
        del state["tracker"]
    return state


def the_lessons(run):
    from dlcourse.checkpoint.resume import resume_state as lesson
    return lesson(run)


def smuggled(run):  # returns nothing; puts the state back itself when the run is built again
    import dlcourse.checkpoint.run as module
    state, build = resume_state(run), module.TrainRun.__init__

    def build_and_restore(self, cfg, group):
        build(self, cfg, group)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        self.tracker.states.update(state["tracker"])
        self.data.load_state_dict(state["data"])
    module.TrainRun.__init__ = build_and_restore
    return {}


def test_resume_state_passes_a_correct_answer_and_another_way(capsys):
    check_resume_state(resume_state)
    check_resume_state(deep_copies)
    assert capsys.readouterr().out.count("resume_state: passed") == 2


@pytest.mark.parametrize("fn,says", [
    (without("rng"), "torch's default generator"),
    (tracker_on_rank_0_only, "rank 1 only"),
    (without("scheduler"), "save the scheduler"),
    (without("data"), "data stream's position"),
    (without("optimizer"), "AdamW's moments"),
])
def test_resume_state_names_what_is_missing(fn, says):
    first, hint = first_line_and_hint(check_resume_state, fn)
    assert "parts from the one that never stopped" in first
    assert says in hint, hint


def test_a_state_kept_in_the_process_instead_of_returned_fails():
    # the resume runs in a second job of fresh processes: nothing but the returned dict crosses
    first, hint = first_line_and_hint(check_resume_state, smuggled)
    assert "parameters before the step" in first and "state_dict" in hint, first


def test_resume_state_refuses_the_lessons_answer():
    first, _ = first_line_and_hint(check_resume_state, the_lessons)
    assert "called resume_state from dlcourse.checkpoint.resume, which this exercise does not " \
        "allow" in first, first

# ---------------------------------------------------------------- exercise 2: resharding


def load_my_shard(metadata, files):
    rank, m = dist.get_rank(), dist.get_world_size()
    base, extra = divmod(metadata["numel"], m)
    start = rank * base + min(rank, extra)
    end = start + base + (rank < extra)
    out = torch.empty(end - start, dtype=torch.float64)
    for c in metadata["chunks"]:
        lo, hi = max(start, c["offset"]), min(end, c["offset"] + c["length"])
        if lo < hi:
            out[lo - start:hi - start] = files.read(c["file"])[lo - c["offset"]:hi - c["offset"]]
    return out


def sorted_and_joined(metadata, files):  # another way: the overlapping chunks in order, one cat
    rank, m = dist.get_rank(), dist.get_world_size()
    sizes = [len(t) for t in torch.tensor_split(torch.empty(metadata["numel"]), m)]
    start = sum(sizes[:rank])
    end = start + sizes[rank]
    parts = [c for c in sorted(metadata["chunks"], key=lambda c: c["offset"])
             if c["offset"] < end and start < c["offset"] + c["length"] and c["length"]]
    if not parts:
        return torch.empty(0, dtype=torch.float64)
    joined = torch.cat([files.read(c["file"]) for c in parts])
    return joined[start - parts[0]["offset"]:end - parts[0]["offset"]]


def end_inclusive(metadata, files):  # off by one: the chunk's last value taken one too far
    rank, m = dist.get_rank(), dist.get_world_size()
    sizes = [len(t) for t in torch.tensor_split(torch.empty(metadata["numel"]), m)]
    start = sum(sizes[:rank])
    end = start + sizes[rank]
    out = torch.zeros(end - start, dtype=torch.float64)
    for c in metadata["chunks"]:
        lo, hi = max(start, c["offset"]), min(end, c["offset"] + c["length"])
        if lo < hi:
            saved = files.read(c["file"])
            out[lo - start:hi - start] = torch.cat([saved, saved[-1:]])[lo - c["offset"] + 1:
                                                                         hi - c["offset"] + 1]
    return out


def reads_everything(metadata, files):
    whole = torch.empty(metadata["numel"], dtype=torch.float64)
    for c in metadata["chunks"]:
        whole[c["offset"]:c["offset"] + c["length"]] = files.read(c["file"])
    return torch.tensor_split(whole, dist.get_world_size())[dist.get_rank()].clone()


def chunk_r_on_rank_r(metadata, files):  # assumes the chunks are listed in order
    whole = torch.cat([files.read(c["file"]) for c in metadata["chunks"]])
    return torch.tensor_split(whole, dist.get_world_size())[dist.get_rank()].clone()


def lessons_boxes(metadata, files):
    from dlcourse.checkpoint.boxes import intersect
    intersect(((0,), (1,)), ((0,), (1,)))
    return load_my_shard(metadata, files)


def test_load_my_shard_passes_a_correct_answer_and_another_way(capsys):
    check_load_my_shard(load_my_shard)
    check_load_my_shard(sorted_and_joined)
    assert capsys.readouterr().out.count("load_my_shard: passed") == 2


@pytest.mark.parametrize("fn,says", [(end_inclusive, "differ"), (reads_everything, "read rank"),
                                     (chunk_r_on_rank_r, "differ")])
def test_load_my_shard_fails_wrong_answers(fn, says):
    first, hint = first_line_and_hint(check_load_my_shard, fn, seed=7)
    assert says in first, first
    assert hint


def test_load_my_shard_refuses_the_lessons_boxes():
    first, _ = first_line_and_hint(check_load_my_shard, lessons_boxes)
    assert "intersect" in first, first

# ---------------------------------------------------------------- exercise 3: the interval


def checkpoint_interval(n, size, bw, restart, rate):
    mtbf, delta = 3600 / (n * rate), size / bw
    tau = math.sqrt(2 * delta * mtbf)
    return tau, 1 - delta / tau - (tau / 2 + restart) / mtbf


def in_hours(n, size, bw, restart, rate):  # another way: everything in hours, converted back
    mtbf_h, delta_h = 1 / (n * rate), size / bw / 3600
    tau_h = (2 * delta_h * mtbf_h) ** 0.5
    return tau_h * 3600, 1 - delta_h / tau_h - (tau_h / 2 + restart / 3600) / mtbf_h


def without_the_2(n, size, bw, restart, rate):
    mtbf, delta = 3600 / (n * rate), size / bw
    tau = math.sqrt(delta * mtbf)
    return tau, 1 - delta / tau - (tau / 2 + restart) / mtbf


def one_gpus_mtbf(n, size, bw, restart, rate):
    mtbf, delta = 3600 / rate, size / bw
    tau = math.sqrt(2 * delta * mtbf)
    return tau, 1 - delta / tau - (tau / 2 + restart) / mtbf


def restart_forgotten(n, size, bw, restart, rate):
    tau, _ = checkpoint_interval(n, size, bw, restart, rate)
    mtbf, delta = 3600 / (n * rate), size / bw
    return tau, 1 - delta / tau - (tau / 2) / mtbf


def planners(n, size, bw, restart, rate):
    from dlcourse.planner.goodput import failure_cost
    c = failure_cost(n, size, bw, restart, rate)
    return c.interval_s, c.goodput


def interval_by_the_key(n, size, bw, restart, rate):
    from dlcourse.checks.checkpoint.checkpoint_interval import _reference
    return _reference(n, size, bw, restart, rate)[:2]


def test_checkpoint_interval_passes_and_names_the_slips(capsys):
    check_checkpoint_interval(checkpoint_interval)
    check_checkpoint_interval(in_hours)
    assert capsys.readouterr().out.count("checkpoint_interval: passed") == 2
    for fn, says in [(without_the_2, "sqrt(2 δ M)"), (one_gpus_mtbf, "any of its n GPUs"),
                     (restart_forgotten, "restart R")]:
        _, hint = first_line_and_hint(check_checkpoint_interval, fn)
        assert says in hint, (fn.__name__, hint)
    first, _ = first_line_and_hint(check_checkpoint_interval, planners)
    assert "failure_cost" in first, first
    first, _ = first_line_and_hint(check_checkpoint_interval, interval_by_the_key)
    assert "called _reference from dlcourse.checks.checkpoint.checkpoint_interval" in first, first
    assert "the check's own answer key" in first, first

# ---------------------------------------------------------------- exercise 4: completeness


def is_complete(path):
    if path.endswith(".tmp"):
        return False
    try:
        with open(os.path.join(path, "metadata.json")) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        return False
    return all(os.path.exists(os.path.join(path, n)) and os.path.getsize(os.path.join(path, n)) == s
               for n, s in files.items())


def loads_every_file(path):  # another way: the name, the metadata, then a real load of each file
    name = os.path.basename(path.rstrip("/"))
    if not name.startswith("step_") or name.endswith(".tmp"):
        return False
    meta = os.path.join(path, "metadata.json")
    if not os.path.exists(meta):
        return False
    with open(meta) as f:
        files = json.load(f)["files"]
    try:
        for n in files:
            torch.load(os.path.join(path, n), weights_only=True)
    except Exception:
        return False
    return True


def accepts_everything(path):
    return True


def metadata_only(path):  # a torn checkpoint with its metadata is accepted
    return not path.endswith(".tmp") and os.path.exists(os.path.join(path, "metadata.json"))


def lessons_files(path):
    from dlcourse.checkpoint.files import read_metadata
    try:
        read_metadata(path)
    except Exception as error:
        if "refuse" in str(error).lower() or "write it yourself" in str(error):
            raise
        return False
    return True


def test_is_complete_passes_two_ways_fails_torn_accepted_refuses_the_lessons(capsys):
    check_is_complete(is_complete)
    check_is_complete(loads_every_file)
    assert capsys.readouterr().out.count("is_complete: passed") == 2
    first, hint = first_line_and_hint(check_is_complete, accepts_everything)
    assert "a torn checkpoint accepted" in first
    first, hint = first_line_and_hint(check_is_complete, metadata_only)
    assert "torn checkpoint accepted" in first and ("file" in hint), hint
    first, _ = first_line_and_hint(check_is_complete, lessons_files)
    assert "read_metadata" in first, first
