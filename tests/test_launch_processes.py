"""dlcourse.launch as a student meets it: from scripts, torchrun, a Jupyter kernel, several at
once, and with the launching process killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from jupyter_client.manager import start_new_kernel

from conftest import run_python, wait_gone

JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    import dlcourse

    def report(folder, sleep):
        # every rank leaves its pid (and its parent's, the forkserver) for the test to watch
        with open(os.path.join(folder, str(dist.get_rank())), "w") as f:
            f.write(f"{os.getpid()} {os.getppid()}")
        time.sleep(sleep)
        t = torch.ones(1)
        dist.all_reduce(t)
        return int(t.item())
    """
)


def _script(tmp_path, body):
    path = tmp_path / "job.py"
    path.write_text(JOB + textwrap.dedent(body))
    return str(path)


def _wait_for_pids(folder, n, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        files = [f for f in os.listdir(folder) if f.isdigit()]
        if len(files) == n:
            time.sleep(0.1)  # let the last one finish writing
            return [tuple(map(int, open(os.path.join(folder, f)).read().split())) for f in files]
        time.sleep(0.1)
    raise AssertionError(f"only {os.listdir(folder)} of {n} ranks started")


def test_a_guarded_script_works(tmp_path):
    path = _script(tmp_path, """
        if __name__ == "__main__":
            print("result", dlcourse.launch(report, sys.argv[1], 0, world_size=2, backend="gloo"))
    """)
    done = run_python(path, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "result [2, 2]" in done.stdout


def test_an_unguarded_script_stops_at_once_naming_the_fix(tmp_path):
    path = _script(tmp_path, """
        print("result", dlcourse.launch(report, sys.argv[1], 0, world_size=2, backend="gloo"))
    """)
    start = time.monotonic()
    done = run_python(path, str(tmp_path))
    assert done.returncode != 0
    assert time.monotonic() - start < 15
    assert "job.py, line " in done.stderr and "dlcourse.launch is called when the script is imported" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert not [f for f in os.listdir(tmp_path) if f.isdigit()]  # no rank ever started


def test_the_same_function_runs_under_torchrun(tmp_path):
    path = _script(tmp_path, """
        if __name__ == "__main__":
            out = dlcourse.launch(report, sys.argv[1], 0, world_size=2)
            print(f"rank {dist.get_rank()} got {out}")
    """)
    done = run_python("-m", "torch.distributed.run", "--nproc-per-node=2", path, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "rank 0 got [2]" in done.stdout and "rank 1 got [2]" in done.stdout


def test_several_programs_launch_at_the_same_time(tmp_path):
    path = _script(tmp_path, """
        if __name__ == "__main__":
            os.makedirs(sys.argv[1])
            print("result", dlcourse.launch(report, sys.argv[1], 0.5, world_size=2, backend="gloo"))
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, path, str(tmp_path / f"job{i}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "result [2, 2]" in out


def test_killing_the_parent_leaves_no_rank_behind(tmp_path):
    path = _script(tmp_path, """
        if __name__ == "__main__":
            dlcourse.launch(report, sys.argv[1], 300, world_size=4, backend="gloo", timeout=600)
    """)
    parent = subprocess.Popen([sys.executable, path, str(tmp_path)],
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        ranks = _wait_for_pids(tmp_path, 4)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    pids = [pid for pid, _ in ranks]
    forkserver = {ppid for _, ppid in ranks}
    assert len(forkserver) == 1
    assert not wait_gone(pids, seconds=10), "ranks outlived their parent"
    assert not wait_gone(forkserver, seconds=10), "the forkserver outlived its parent"


def _execute(client, code, timeout=60):
    """Run `code` in the kernel; return (reply content, text printed to the cell)."""
    msg_id = client.execute(code)
    printed = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return _reply_to(client, msg_id, timeout)["content"], "".join(printed)


def _reply_to(client, msg_id, timeout):
    """The shell reply to `msg_id`. A loaded machine can leave an extra kernel_info reply in the
    queue (start_new_kernel asks again each second until the kernel answers): skip others."""
    while True:
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_a_notebook_cell_launches_streams_and_survives_an_interrupt(tmp_path):
    manager, client = start_new_kernel(kernel_name="python3", env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        reply, printed = _execute(client, JOB + textwrap.dedent("""
            double = lambda x: 2 * x   # a lambda defined in a cell travels by value
            def cell_fn():
                print("hi from", dist.get_rank())
                return double(dist.get_rank())
            dlcourse.launch(cell_fn, world_size=2, backend="gloo")
        """))
        assert reply["status"] == "ok", reply
        assert "[rank 0] hi from 0" in printed and "[rank 1] hi from 1" in printed

        msg_id = client.execute(
            f"dlcourse.launch(report, {str(tmp_path)!r}, 300, world_size=2, backend='gloo', timeout=600)")
        pids = [pid for pid, _ in _wait_for_pids(tmp_path, 2)]
        manager.interrupt_kernel()
        reply = _reply_to(client, msg_id, timeout=30)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert not wait_gone(pids, seconds=10), "ranks outlived the interrupted cell"

        reply, printed = _execute(client, "print(dlcourse.launch(cell_fn, world_size=2, backend='gloo'))")
        assert reply["status"] == "ok", reply  # the kernel is still usable
        assert "[0, 2]" in printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_program_from_standard_input_is_refused_with_the_fix():
    done = subprocess.run([sys.executable, "-"], input=JOB + "dlcourse.launch(report, '.', 0)\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "cannot start ranks from a program without a file" in done.stderr
    assert "Save it as a .py file" in done.stderr


def test_a_rank_traceback_shows_the_notebook_cell_line():
    manager, client = start_new_kernel(kernel_name="python3", env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        reply, printed = _execute(client, textwrap.dedent("""
            import dlcourse, torch.distributed as dist
            def broken():
                if dist.get_rank() == 1:
                    raise KeyError("no such layer")  # the line the student must see
            try:
                dlcourse.launch(broken, world_size=2, backend="gloo")
            except dlcourse.RankError as error:
                print(error.traceback)
        """))
        assert reply["status"] == "ok", reply
        assert 'raise KeyError("no such layer")  # the line the student must see' in printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_the_first_launchs_start_up_does_not_count_against_its_timeout(tmp_path):
    # Starting the forkserver (it imports torch) takes over a second; the job itself, far less.
    path = _script(tmp_path, """
        if __name__ == "__main__":
            start = time.monotonic()
            out = dlcourse.launch(lambda: dist.get_rank(), world_size=2, backend="gloo", timeout=0.5)
            print("result", out, "start-up longer than the timeout:", time.monotonic() - start > 0.5)
    """)
    done = run_python(path)
    assert done.returncode == 0, done.stderr
    assert "result [0, 1] start-up longer than the timeout: True" in done.stdout
