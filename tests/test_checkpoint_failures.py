"""Lesson 11: a rank SIGKILLed mid-run and mid-save (dlcourse/checkpoint/failures.py, files.py);
the restarted job ends equal to a run that never failed, and a torn checkpoint is refused."""

import os

import pytest
import torch

import dlcourse
from dlcourse.checkpoint import CheckpointError, RunConfig, latest, read_metadata, save_checkpoint
from dlcourse.checkpoint.failures import run_with_restarts
from dlcourse.checkpoint.files import load_rank_state
from dlcourse.checkpoint.resume import check_same_model
from dlcourse.checkpoint.sharded import load_pieces

TOTAL, EVERY = 7, 3  # checkpoints at steps 3 and 6


@pytest.fixture(scope="module")
def never_failed(tmp_path_factory):
    return run_with_restarts(str(tmp_path_factory.mktemp("ref")), RunConfig(), TOTAL, EVERY)


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_a_rank_killed_mid_run_resumes_equal_to_the_run_that_never_failed(tmp_path, never_failed):
    out = run_with_restarts(str(tmp_path), RunConfig(), TOTAL, EVERY, kill=(1, 5))
    assert never_failed.restarts == 0 and never_failed.redone == 0
    assert out.restarts == 1 and "rank 1 was killed by SIGKILL" in out.failures[0]
    assert [r[0] for r in out.results] == [3, 3]  # both ranks went on from step 3's checkpoint
    assert out.redone == 5 - 3  # steps 4 and 5 were trained twice
    for mine, ref in zip(out.results, never_failed.results):
        assert _max_diff(mine[1], ref[1]) == 0.0  # every parameter, bit for bit
        assert mine[2] == ref[2][-len(mine[2]):]  # the resumed losses are the same numbers


def test_a_crash_during_a_save_leaves_the_previous_checkpoint(tmp_path, never_failed):
    out = run_with_restarts(str(tmp_path), RunConfig(), TOTAL, EVERY, kill_in_save=(1, 6))
    assert out.restarts == 1
    assert [r[0] for r in out.results] == [3, 3]  # step 6's save never committed
    assert out.redone == 6 - 3
    assert _max_diff(out.results[0][1], never_failed.results[0][1]) == 0.0


def _save_two(root):
    import torch.distributed as dist
    save_checkpoint(root, 1, {"w": torch.full((3,), float(dist.get_rank()))})
    save_checkpoint(root, 2, {"w": torch.zeros(3)},
                    crash_before_commit=lambda r: os._exit(9) if r == 1 else None)


def test_a_torn_checkpoint_is_refused_with_a_clear_line(tmp_path):
    root = str(tmp_path)
    with pytest.raises(dlcourse.RankError):
        dlcourse.launch(_save_two, root, world_size=2)
    assert sorted(os.listdir(root)) == ["step_000001", "step_000002.tmp"]
    assert latest(root) == os.path.join(root, "step_000001")  # the .tmp one is skipped
    with pytest.raises(CheckpointError, match="never finished"):
        read_metadata(os.path.join(root, "step_000002.tmp"))
    with pytest.raises(CheckpointError, match=r"a folder of checkpoints, not one checkpoint: pass "
                                              r"latest\(root\) .* \(newest: step_000001\)$"):
        read_metadata(root)  # the root passed where a checkpoint is wanted: a bad path
    with pytest.raises(CheckpointError, match="is a resume state saved by 2 ranks .*: load it with "
                                              "files.load_rank_state on 2 ranks$"):
        load_pieces(os.path.join(root, "step_000001"), [])  # another kind of checkpoint
    os.makedirs(os.path.join(root, "logs"))
    with pytest.raises(CheckpointError, match="is not a checkpoint: no metadata.json and no rank "
                                              "files"):
        read_metadata(os.path.join(root, "logs"))
    done = os.path.join(root, "step_000001")
    assert read_metadata(done)["world_size"] == 2
    assert load_rank_state(done, 1, 2)["w"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(CheckpointError, match="saved by 2 ranks, this job has 3"):
        load_rank_state(done, 0, 3)
    with open(os.path.join(done, "rank00001.pt"), "r+b") as f:
        f.truncate(10)  # a file cut short
    with pytest.raises(CheckpointError, match="torn: rank00001.pt holds 10 bytes"):
        read_metadata(done)
    os.remove(os.path.join(done, "rank00001.pt"))
    with pytest.raises(CheckpointError, match="torn: rank00001.pt is missing"):
        read_metadata(done)
    os.remove(os.path.join(done, "metadata.json"))
    with pytest.raises(CheckpointError, match="has no metadata.json"):
        read_metadata(done)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_metadata(os.path.join(root, "elsewhere"))


def test_a_state_of_another_model_is_named_in_one_line():
    model = {"w": torch.zeros(4, 8), "b": torch.zeros(8)}
    check_same_model({"w": torch.ones(4, 8), "b": torch.ones(8)}, model)  # same names and shapes
    with pytest.raises(CheckpointError, match=r"w is \(4, 16\) in the checkpoint, \(4, 8\) in the model"):
        check_same_model({"w": torch.zeros(4, 16), "b": torch.zeros(8)}, model)
    with pytest.raises(CheckpointError, match="c is only in the checkpoint"):
        check_same_model({"w": torch.zeros(4, 8), "b": torch.zeros(8), "c": torch.zeros(1)}, model)
    with pytest.raises(CheckpointError, match=r"b is only in the model \(0 names only saved, 1 "):
        check_same_model({"w": torch.zeros(4, 8)}, model)
