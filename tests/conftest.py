import os
import subprocess
import sys
import time

import cloudpickle
import pytest
import torch

# The tests read the English messages; a student's DLCOURSE_LANG=zh (dlcourse/i18n/) must not
# turn them Chinese. tests/test_i18n.py sets it where it tests the Chinese ones.
os.environ.pop("DLCOURSE_LANG", None)


@pytest.fixture(autouse=True)
def _send_test_functions_by_value(request):
    """Ranks get a test module's functions by value, as they get a notebook's, instead of
    importing the test module (and pytest with it) in every rank: 0.1 s a launch, not 0.5 s."""
    if request.module is not None:
        cloudpickle.register_pickle_by_value(request.module)


def pid_alive(pid):
    """True while `pid` is a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, seconds=10.0):
    """Wait until none of `pids` runs; return those still alive after `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def run_python(*args, timeout=120, env=None):
    """Run `python *args` in a fresh interpreter outside any launched job; return CompletedProcess."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        full_env.pop(name, None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
