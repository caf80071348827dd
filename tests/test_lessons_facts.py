"""Facts the lessons 00-03 state, held by tests (issue 14): a command a lesson prints must work,
a number a lesson explains must be what the library computes."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"


def _lesson(name):
    return nbformat.read(LESSONS / name, as_version=4)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lesson_00_script():
    """The demo script of lesson 00, taken from the cell that writes it."""
    cell = next(c for c in _lesson("00_launch.ipynb").cells
                if c.cell_type == "code" and "script = textwrap.dedent(" in c.source)
    scope = {}
    exec(cell.source.split("folder = ")[0], scope)  # up to the cell's own launch
    return scope["script"]


def _two_node_commands():
    """Every `torchrun --nnodes=2 ...` command lesson 00's markdown gives."""
    cells = _lesson("00_launch.ipynb").cells
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    return re.findall(r"`(torchrun --nnodes=2[^`]*)`", text)


def _run_two_nodes(command, tmp_path):
    """Start the lesson's command twice on 127.0.0.1, as two "nodes" of 2 ranks each."""
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    procs = []
    for node_rank in ("0", "1"):
        args = (command.replace("HOST", "127.0.0.1").replace("29500", port)
                .replace("--nproc-per-node=8", "--nproc-per-node=2")
                .replace("=R ", f"={node_rank} ")
                .split())
        assert args[0] == "torchrun" and args[-1] == "demo.py", command
        procs.append(subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args[1:]],
                                      cwd=tmp_path, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        return [p.communicate(timeout=150) + (p.returncode,) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_lesson_00_gives_both_two_node_forms():
    commands = _two_node_commands()
    assert any("--rdzv-backend=c10d" in c and "--rdzv-id=" in c for c in commands), commands
    assert any("--node-rank=R" in c and "--master-addr=HOST" in c for c in commands), commands


@pytest.mark.parametrize("form", ["c10d", "static"])
def test_the_two_node_command_of_lesson_00_runs_one_job_of_4_ranks(tmp_path, form):
    # Two torchrun agents on one machine stand for two nodes: each starts 2 ranks, and the
    # rendezvous must join them into one job of 4 (1 + 2 + 3 + 4 = 10 on every rank). With the
    # static rendezvous and no --node-rank both agents take node rank 0 and the job never forms.
    command = next(c for c in _two_node_commands()
                   if ("c10d" in c) == (form == "c10d"))
    (tmp_path / "demo.py").write_text(_lesson_00_script())
    outputs = _run_two_nodes(command, tmp_path)
    printed = "".join(out for out, _, _ in outputs)
    for out, err, code in outputs:
        assert code == 0, err[-3000:]
    for rank in range(4):
        assert f"rank {rank} got [10.0]" in printed, printed


# ---- lesson 01 -------------------------------------------------------------------------------

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from dlcourse.memory import (checkpoint_blocks, measure_peak, measure_step,  # noqa: E402
                             step_flops, storage_bytes)
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens  # noqa: E402

SMALL = dict(vocab_size=64, seq_len=16, n_layers=3, n_heads=2, hidden=32)


def _layer_forward_flops(config, batch):
    with FlopCounterMode(display=False) as counter:
        GPT(config).blocks[0](torch.randn(batch, config.seq_len, config.hidden))
    return counter.get_total_flops()


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_checkpointing_reruns_whole_layers_with_dropout_stops_before_the_last_matmul_without(
        dropout):
    config, batch = GPTConfig(**SMALL, dropout=dropout), 4
    x, y = synthetic_tokens(batch, config, seed=1)
    plain = step_flops(GPT(config), x, y, lm_loss)
    ckpt = step_flops(checkpoint_blocks(GPT(config)), x, y, lm_loss)
    rerun = ckpt["backward"] - plain["backward"]
    layer = _layer_forward_flops(config, batch)
    proj = 2 * batch * config.seq_len * 4 * config.hidden * config.hidden  # MLP output projection
    expected = config.n_layers * (layer if dropout else layer - proj)
    assert ckpt["forward"] == plain["forward"]
    assert rerun == expected, (rerun, expected, layer, proj)
    assert rerun < (plain["forward"] + plain["backward"]) / 3  # the head is not rerun


def test_the_true_peak_is_above_the_saved_tensor_peak_and_inside_backward():
    torch.manual_seed(0)
    config = GPTConfig(**SMALL, dropout=0.1)
    x, y = synthetic_tokens(4, config, seed=1)
    model = GPT(config)
    peak = measure_peak(model, x, y, lm_loss)
    counted = GPT(config)
    step = measure_step(counted, x, y, lm_loss, torch.optim.SGD(counted.parameters(), lr=0.1))
    assert peak.phase == "backward"
    assert peak.bytes > step.peak.parts.total
    assert peak.at_forward_end >= step.phases["forward"].total  # everything saved is alive
    # After backward: what was there before (parameters, the batch), the gradients, and the
    # loss, a 0-dim fp32 tensor still referenced when the profiler stops.
    grads = storage_bytes(p.grad for p in model.parameters())
    assert peak.at_end == storage_bytes([*model.parameters(), x, y]) + grads + 4
    with pytest.raises(ValueError, match="set_to_none"):
        measure_peak(model, x, y, lm_loss)  # gradients are there now


def test_autocast_weight_copies_are_two_bytes_per_matmul_weight_not_two_psi():
    config = GPTConfig(**SMALL)
    x, y = synthetic_tokens(4, config, seed=1)
    model = GPT(config)
    step = measure_step(model, x, y, lm_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                        autocast_dtype=torch.bfloat16)
    matmul_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
                         and m.weight is not model.tok_emb.weight) + model.tok_emb.weight.numel()
    assert step.phases["forward"].weight_copies == 2 * matmul_weights
    assert step.phases["forward"].weight_copies < 2 * sum(p.numel() for p in model.parameters())


# ---- lesson 02 figures -----------------------------------------------------------------------

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

import dlcourse  # noqa: E402
from dlcourse.collectives.demo import ring_trace  # noqa: E402
from dlcourse.plots.collectives import plot_busbw, plot_ring_step  # noqa: E402


def test_the_ring_frames_draw_their_arrows_beside_the_numbers_not_over_them():
    trace = dlcourse.launch(ring_trace, world_size=4, backend="gloo")
    n_chunks = len(trace[0][0][3])  # a frame: (label, chunk sent, chunk arrived, values)
    for index in range(1, len(trace[0])):
        fig, ax = plt.subplots()
        plot_ring_step(trace, index, ax)
        arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
        assert len(arrows) == 4  # one per rank: what it sent to the next
        for arrow in arrows:
            (x0, _), (x1, _) = arrow._posA_posB
            assert min(x0, x1) >= n_chunks, (index, x0, x1)  # right of the last chunk's cell
        plt.close(fig)


def test_the_bus_bandwidth_figure_draws_one_over_beta():
    fig = plot_busbw([1024, 2048], {"ring": [1e-3, 1.5e-3]}, world_size=4, link_bandwidth=2e9)
    lines = [l for l in fig.axes[0].get_lines() if "1 / beta" in l.get_label()]
    assert len(lines) == 1 and set(lines[0].get_ydata()) == {2.0}  # GB/s
    plt.close(fig)
