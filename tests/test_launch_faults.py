"""The four launcher faults of issue 16: a launching process killed while a rank holds the GIL,
processes a rank starts, timeouts out of range, and a multiprocessing.Pool inside a rank."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from jupyter_client.manager import start_new_kernel

import dlcourse
from conftest import pid_alive, wait_gone
from dlcourse import supervise
from dlcourse.launcher import MAX_TIMEOUT_S
from test_launch_processes import _execute, _wait_for_pids


def _descendants(pid):
    """Every process below `pid`, from /proc (a parent's children, their children, ...)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _kill_all(pids):
    """Clean up after a failing assertion: the processes this test started, by id."""
    for p in pids:
        if pid_alive(p):
            os.kill(p, signal.SIGKILL)


HOLDS_THE_GIL = textwrap.dedent(
    """
    import ctypes, os, sys
    import torch.distributed as dist
    import dlcourse

    def spin(folder):
        with open(os.path.join(folder, str(dist.get_rank())), "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        # libc's sleep through PyDLL keeps the GIL: no Python thread of this rank runs again.
        ctypes.PyDLL(None).sleep(300)

    if __name__ == "__main__":
        dlcourse.launch(spin, sys.argv[1], world_size=2, backend="gloo", timeout=600)
    """
)


def test_killing_the_parent_while_a_rank_holds_the_gil_leaves_nothing_behind(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(HOLDS_THE_GIL)
    folder = tmp_path / "pids"
    folder.mkdir()
    parent = subprocess.Popen([sys.executable, str(script), str(folder)],
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    family = []
    try:
        ranks = _wait_for_pids(folder, 2, seconds=120)
        family = _descendants(parent.pid)  # forkserver, resource tracker, ranks
        assert {pid for pid, _ in ranks} <= set(family)
        assert len(family) >= 4
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        # The forkserver exits on its own (it imported torch: seconds on a loaded machine).
        assert not wait_gone(family, seconds=60), "processes outlived the launching process"
    finally:
        _kill_all(family)


def _start_then_return(how):
    def fn():
        if how == "subprocess":
            child = subprocess.Popen(["sleep", "300"]).pid
        else:
            child = os.fork()
            if child == 0:  # the forked copy of the rank: it holds the rank's output pipe
                time.sleep(300)
                os._exit(0)
        return child

    return fn


@pytest.mark.parametrize("how", ["subprocess", "os.fork"])
def test_a_process_a_rank_starts_ends_with_the_launch(monkeypatch, how):
    # A rank's children hold its output pipe; the parent waits EXIT_WAIT_S for it to close.
    # Made long here, so a stall cannot hide in a loaded machine's slowness.
    monkeypatch.setattr(supervise, "EXIT_WAIT_S", 120.0)
    start = time.monotonic()
    children = dlcourse.launch(_start_then_return(how), world_size=2, backend="gloo")
    try:
        assert time.monotonic() - start < 60, "the launch waited for the rank's children"
        assert not wait_gone(children, seconds=5), "a rank's children outlived the launch"
    finally:
        _kill_all(children)


def _write_pid(folder):
    (Path(folder) / str(dist.get_rank())).write_text(str(os.getpid()))


@pytest.mark.parametrize("timeout", [math.inf, math.nan, MAX_TIMEOUT_S + 1, 30 * 24 * 3600,
                                     True, "60", None])
def test_a_timeout_out_of_range_is_refused_before_any_rank_starts(tmp_path, timeout):
    with pytest.raises(ValueError, match=r"timeout is in seconds and must be > 0 and at most "
                                         r"2073570 \(24 days\), got"):
        dlcourse.launch(_write_pid, str(tmp_path), world_size=2, backend="gloo", timeout=timeout)
    assert not list(tmp_path.iterdir())  # no rank ever ran


def test_the_longest_timeout_allowed_works():
    assert dlcourse.launch(dist.get_rank, world_size=2, backend="gloo",
                           timeout=MAX_TIMEOUT_S) == [0, 1]


POOL_CELL = textwrap.dedent(
    """
    import multiprocessing as mp
    import torch.distributed as dist
    import dlcourse

    def square(x):
        return x * x

    def squares():
        with mp.Pool(2) as pool:
            return pool.map(square, range(dist.get_rank(), dist.get_rank() + 3))

    print("squares", dlcourse.launch(squares, world_size=2, backend="gloo"))
    """
)


def test_a_pool_map_over_a_notebook_function_works_inside_a_rank():
    manager, client = start_new_kernel(kernel_name="python3",
                                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        reply, printed = _execute(client, POOL_CELL, timeout=180)
        assert reply["status"] == "ok", reply
        assert "squares [[0, 1, 4], [1, 4, 9]]" in printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
