"""Lesson 04's proofs and measurements on the whole course GPT, on real gloo ranks: trained K
AdamW steps with tensor parallelism (tp = 2 and 4) and with sequence parallelism, it equals the
single-process reference; one layer's collectives are the papers' count; parameter and
activation bytes per rank are the formulas', byte for byte.

Tolerance of the training proof: float64 throughout. The ranks' sums add the same numbers as one
process in another order (~1e-16 relative). AdamW divides each update by sqrt(v) + eps, so a
gradient element that is (nearly) zero in exact arithmetic, its rounding noise being a large part
of it, can move by up to ~lr x noise / eps. Measured: at most 3e-14 after 3 steps at lr 1e-3
(tp = 4, with and without sequence parallelism). We allow 1e-11. Sequence parallelism without the
LayerNorm gradients' all-reduce ends 6e-3 away (measured), 8 orders of magnitude above.
"""

from functools import partial

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.memory import activation_bytes
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor import full_parameters, parallelize, vocab_parallel_lm_loss
from dlcourse.parallel.tensor.activations import (measure_activations, table2_differences,
                                                  tp_saved_tensors)
from dlcourse.parallel.tensor.measure import (as_counter, count_layer, layer_formula,
                                              local_param_bytes, param_bytes)

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=4, hidden=16)
CFG_NO_BIAS = GPTConfig(vocab_size=32, seq_len=8, n_layers=1, n_heads=4, hidden=16, bias=False,
                        tie_embeddings=False)
BATCH, STEPS, LR, TOL = 4, 3, 1e-3, 1e-11


def train(model, loss_fn, data):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss_fn(model(data[0]), data[1]).backward()
        optimizer.step()


def trained_weights(config, group, sequence_parallel):
    """{name: whole weight} after STEPS: (reference, tensor-parallel), on this rank."""
    data = synthetic_tokens(BATCH, config, seed=1)
    reference = GPT(config, seed=0)
    train(reference, lm_loss, data)
    model = parallelize(GPT(config, seed=0), group, sequence_parallel)
    train(model, partial(vocab_parallel_lm_loss, group=group), data)
    start = dict(GPT(config, seed=0).named_parameters())
    moved = max((p - start[n]).abs().max().item() for n, p in reference.named_parameters())
    want = {n: p.detach() for n, p in reference.named_parameters()}
    return want, full_parameters(model, group), moved


def measurements(config, group, sequence_parallel):
    t = dist.get_world_size(group)
    data = synthetic_tokens(BATCH, config, seed=1)
    model = parallelize(GPT(config, seed=0), group, sequence_parallel)
    held, _ = measure_activations(model, *data, partial(vocab_parallel_lm_loss, group=group))
    layer = count_layer(config, BATCH, group, sequence_parallel)
    return {"activations": held,
            "activations estimated": sum(r.nbytes for r in tp_saved_tensors(config, BATCH, t,
                                                                             sequence_parallel)),
            "comm": {phase: as_counter(records) for phase, records in layer.items()},
            "comm formula": layer_formula(config, BATCH, t, sequence_parallel),
            "params": local_param_bytes(model), "params formula": param_bytes(config, t)}


def everything():
    torch.set_default_dtype(torch.float64)  # this rank process only
    groups = {4: dist.group.WORLD, 2: RankGrid(dp=2, tp=2).new_groups().tp}
    out = {}
    for tp, group in groups.items():
        for sp in (False, True):
            out["train", tp, sp] = trained_weights(CFG, group, sp)
            out["train no bias", tp, sp] = trained_weights(CFG_NO_BIAS, group, sp)
    torch.set_default_dtype(torch.float32)  # measured as the lesson runs: fp32
    for tp, group in groups.items():
        for sp in (False, True):
            for name, config in (("bias", CFG), ("no bias", CFG_NO_BIAS)):
                out["measure", name, tp, sp] = measurements(config, group, sp)
    return out


@pytest.fixture(scope="module")
def results():
    return dlcourse.launch(everything, world_size=4, backend="gloo")


TP_SP = [(tp, sp) for tp in (2, 4) for sp in (False, True)]


@pytest.mark.parametrize("case", ["train", "train no bias"])
@pytest.mark.parametrize("tp, sp", TP_SP)
def test_gpt_trained_tensor_parallel_equals_one_process(results, case, tp, sp):
    for rank, out in enumerate(results):
        want, got, moved = out[case, tp, sp]
        assert got.keys() == want.keys()
        for name in want:
            error = (got[name] - want[name]).abs().max().item()
            assert error <= TOL, f"rank {rank}, tp {tp}, sp {sp}: {name} off by {error:.1e}"
        assert moved > 1e-4  # it trained: AdamW moved the weights ~lr per step


@pytest.mark.parametrize("config", ["bias", "no bias"])
@pytest.mark.parametrize("tp, sp", TP_SP)
def test_one_layer_makes_the_papers_collectives(results, config, tp, sp):
    for out in results:
        m = out["measure", config, tp, sp]
        assert m["comm"] == m["comm formula"]


@pytest.mark.parametrize("config", ["bias", "no bias"])
@pytest.mark.parametrize("tp, sp", TP_SP)
def test_parameter_bytes_per_rank_are_psi_over_t_plus_the_replicated(results, config, tp, sp):
    for out in results:
        m = out["measure", config, tp, sp]
        assert m["params"] == m["params formula"]


@pytest.mark.parametrize("config", ["bias", "no bias"])
@pytest.mark.parametrize("tp, sp", TP_SP)
def test_activation_bytes_measured_equal_the_estimate_byte_for_byte(results, config, tp, sp):
    for out in results:
        m = out["measure", config, tp, sp]
        assert m["activations"] == m["activations estimated"]


@pytest.mark.parametrize("tp, sp", TP_SP + [(1, False), (8, True)])
def test_layer_estimate_is_table2_plus_the_listed_differences(tp, sp):
    config = GPTConfig(vocab_size=64, seq_len=16, n_layers=3, n_heads=8, hidden=32)
    rows = tp_saved_tensors(config, BATCH, tp, sp)
    ours = sum(r.nbytes for r in rows if r.where == "block") // config.n_layers
    theirs = activation_bytes(config.seq_len, BATCH, config.hidden, config.n_heads, tp=tp,
                              sequence_parallel=sp, bytes_per_value=4, mask_bytes=0)
    assert ours - theirs == sum(table2_differences(config, BATCH, tp, sp).values())
