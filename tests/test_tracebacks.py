"""What a student's notebook shows when a grader fails or a launch is interrupted: their cell and
the message, none of the course's own frames (`dlcourse/tracebacks.py`). One real kernel, as
JupyterLab runs it, for every case."""

import os
import re
import textwrap
import time

from jupyter_client.manager import start_new_kernel

from conftest import wait_gone

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(client, code, timeout=120):
    """Execute `code`; return the shell reply's content and the error output's traceback text."""
    msg_id = client.execute(textwrap.dedent(code))
    traceback = ""
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "error":
            traceback = ANSI.sub("", "\n".join(msg["content"]["traceback"]))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # the shell reply; skip a stray kernel_info reply from start-up
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], traceback


COURSE_FILE = re.compile(r"dlcourse/[\w/]+\.py")


def _course_lines(traceback):
    """The traceback's lines that name a file of the course (`dlcourse/checks/core/ranks.py:219`).
    """
    return [line for line in traceback.splitlines() if COURSE_FILE.search(line)]


def test_a_student_sees_their_cell_and_the_message_not_the_course(tmp_path):
    manager, client = start_new_kernel(kernel_name="python3",
                                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        reply, _ = _run(client, """
            import os, time, torch, torch.distributed as dist
            import dlcourse
            from dlcourse.checks.launch import check_gather_all
            from dlcourse.checks.memory import check_count_params
        """)
        assert reply["status"] == "ok", reply

        # A wrong answer on the ranks: the message, below the student's one line.
        reply, traceback = _run(client, """
            def gather_all(x):
                return torch.stack([x] * dist.get_world_size()) + 1
            check_gather_all(gather_all)  # the student's line
        """)
        assert reply["ename"] == "CheckFailed"
        assert "check_gather_all(gather_all)  # the student's line" in traceback
        assert "returned wrong values" in traceback
        assert _course_lines(traceback) == [], traceback

        # A student's bug in an in-process check: their own line is shown under the message.
        reply, traceback = _run(client, """
            def count_gpt_params(config):
                return config.no_such_field  # the student's bug
            check_count_params(count_gpt_params)
        """)
        assert reply["ename"] == "CheckFailed"
        assert "return config.no_such_field  # the student's bug" in traceback
        assert "check_count_params(count_gpt_params)" in traceback
        assert _course_lines(traceback) == [], traceback

        # An interrupt during a launch: one short message, and no rank left running.
        msg_id = client.execute(textwrap.dedent(f"""
            def sleeper():
                open(os.path.join({str(tmp_path)!r}, str(os.getpid())), "w").close()
                time.sleep(300)
            dlcourse.launch(sleeper, world_size=2, backend="gloo", timeout=600)
        """))
        pids = _wait_for_pid_files(tmp_path, 2)
        manager.interrupt_kernel()
        traceback = ""
        while True:
            msg = client.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                assert msg["content"]["ename"] == "KeyboardInterrupt"
                traceback = ANSI.sub("", "\n".join(msg["content"]["traceback"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert "KeyboardInterrupt: launch interrupted; every rank was stopped" in traceback
        assert _course_lines(traceback) == [], traceback
        assert len(traceback.splitlines()) < 15, traceback
        assert not wait_gone(pids, seconds=10), "ranks outlived the interrupted cell"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _wait_for_pid_files(folder, n, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pids = [int(name) for name in os.listdir(folder) if name.isdigit()]
        if len(pids) == n:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"only {os.listdir(folder)} of {n} ranks started")
