"""Lesson 11: sharded checkpoints from scratch (dlcourse/checkpoint/boxes.py, sharded.py,
reshard.py): saved by one layout on real ranks, loaded by another from the metadata alone, equal
element for element to the saved state as the saving strategy's own collectives gather it."""

import math
import random

import pytest
import torch

import dlcourse
from dlcourse.checkpoint import CheckpointError
from dlcourse.checkpoint.boxes import flat_boxes, intersect
from dlcourse.checkpoint.reshard import ShardConfig, load_job, n_params, save_job
from dlcourse.checkpoint.files import load_rank_state, read_metadata
from dlcourse.checkpoint.sharded import load_pieces, written_bytes_formula

STEP_BYTES = 4  # AdamW's step count, a float32 scalar, saved beside the pieces


def _read(t, box):
    for d, (o, s) in enumerate(zip(*box)):
        t = t.narrow(d, o, s)
    return t


@pytest.mark.parametrize("seed", range(3))
def test_flat_boxes_cover_a_flat_range_in_order_exactly_once(seed):
    rng = random.Random(seed)
    for _ in range(300):
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 4)))
        n = math.prod(shape)
        start = rng.randint(0, n)
        end = rng.randint(start, n)
        whole = torch.arange(n).view(shape)
        got = [v for box in flat_boxes(shape, start, end) for v in _read(whole, box).flatten().tolist()]
        assert got == list(range(start, end)), (shape, start, end)


def test_intersect():
    assert intersect(((0, 2), (3, 4)), ((1, 0), (5, 3))) == ((1, 2), (2, 1))
    assert intersect(((0,), (3,)), ((3,), (2,))) is None


def _equal(saved, loaded):
    assert set(saved) == set(loaded)
    return max((saved[k] - loaded[k]).abs().max().item() for k in saved)


@pytest.mark.parametrize("layout,n,m", [("zero3", 4, 2), ("dp_tp", 4, 4), ("zero3", 3, 4)])
def test_a_sharded_checkpoint_loads_into_another_layout_element_for_element(tmp_path, layout, n, m):
    cfg = ShardConfig()
    saved = dlcourse.launch(save_job, str(tmp_path), layout, cfg, world_size=n)
    path, whole = saved[0][0], saved[0][2]
    loaded = dlcourse.launch(load_job, path, cfg, world_size=m)
    for read, state, step in loaded:
        assert _equal(whole, state) == 0.0  # copies: not one bit may change
        assert step == cfg.steps
        # a rank of m reads its 1/m of parameters and both moments, and the step count once
        assert abs(read - STEP_BYTES - written_bytes_formula(n_params(cfg), m)) <= 3 * 8 * m
    wrote = [w for _, w, _ in saved]
    if layout == "zero3":  # each rank writes its 1/n (the padding is not saved), and the step
        assert all(abs(w - STEP_BYTES - written_bytes_formula(n_params(cfg), n)) <= 3 * 8 * n
                   for w in wrote)
    else:  # DP x TP: one dp replica writes; together they write every byte once
        assert wrote[2:] == [0, 0]
        assert sum(wrote) == STEP_BYTES + written_bytes_formula(n_params(cfg), 1)


def test_a_checkpoint_of_another_model_is_refused_naming_the_tensor(tmp_path):
    cfg = ShardConfig()
    path = dlcourse.launch(save_job, str(tmp_path), "zero3", cfg, world_size=2)[0][0]
    other = ShardConfig(model=ShardConfig().model.__class__(vocab_size=36, seq_len=8, n_layers=2,
                                                             n_heads=2, hidden=16))
    # whichever rank fails first names its first tensor: a matrix (36, 12) or a vector (12,)
    with pytest.raises(dlcourse.RankError, match=r"checkpoint from another model: param/\S+ is "
                                                 r"\((\d+, )?12,?\) in .*, \((\d+, )?16,?\) in "
                                                 r"this model"):
        dlcourse.launch(load_job, path, other, world_size=2)
    with pytest.raises(dlcourse.RankError, match="no checkpoint at"):
        dlcourse.launch(load_job, str(tmp_path / "nowhere"), cfg, world_size=2)
    assert issubclass(CheckpointError, RuntimeError)
    # the same checkpoint read here, without ranks: each difference named in its one line
    table = read_metadata(path)["tensors"]
    name, entry = next((n, e) for n, e in table.items() if n != "adam_step")
    shape, box = tuple(entry["shape"]), ((0,) * len(entry["shape"]), tuple(entry["shape"]))
    with pytest.raises(CheckpointError, match=rf"another model: {name} is torch.float64 in .*, "
                                              r"torch.float32 in this model$"):
        load_pieces(path, [(name, shape, box, torch.zeros(shape, dtype=torch.float32))])
    with pytest.raises(CheckpointError, match=r"another model: .* has no 'param/lm_head.bias'"):
        load_pieces(path, [("param/lm_head.bias", (36,), ((0,), (36,)), torch.zeros(36))])
    with pytest.raises(CheckpointError, match="is a sharded checkpoint .*: load it with "
                                              "sharded.load_pieces$"):
        load_rank_state(path, 0, 2)
    with pytest.raises(CheckpointError, match="is a folder of checkpoints, not one checkpoint: "
                                              r"pass latest\(root\) .* \(newest: step_\d{6}\)$"):
        load_pieces(str(tmp_path), [])
