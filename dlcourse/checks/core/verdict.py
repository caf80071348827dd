"""The verdicts of a submission's graders, decided in a process that no student cell ran in
(`dlcourse grade`; the grading engine starts it as `python -m dlcourse.checks.core.verdict`).

The kernel that ran the submission only pickled the objects each grader call names
(`dlcourse/grading/export.py`). Here each check is imported fresh and given those bytes as
`Submitted` objects, which are never unpickled in this process: the check runs them on ranks and
reads back data (`core.run_on_ranks`, `core.call_in_process`). So a cell that replaced the check,
an IPython exception hook or an input transformer decides nothing.

Input and output are `dlcourse/grading/verdicts.py`'s: a JSON job on stdin, with the key that
signs the one line of verdicts printed on stdout.
"""

import contextlib
import ctypes
import importlib
import json
import sys

from dlcourse.checks.core import Submitted
from dlcourse.grading.export import MAX_BYTES
from dlcourse.grading.verdicts import VERDICT_TAG, sign


def main():
    job = json.loads(sys.stdin.read())
    key = bytes.fromhex(job.pop("key"))
    _not_inspectable()
    verdicts = {}
    for grader in job["graders"]:
        verdicts[str(grader["cell"])] = _verdict(grader)
    body = json.dumps(verdicts)
    print(f"{VERDICT_TAG} {body} {sign(key, body)}", flush=True)


def _verdict(grader):
    """{} if the check passed, else the exception's type name and message."""
    try:
        check = _check(grader["module"], grader["function"])
        args = [_argument(a, grader["function"]) for a in grader["args"]]
        with contextlib.redirect_stdout(sys.stderr):  # the check's own prints are not the verdict
            check(*args)
    except Exception as error:
        return {"ename": type(error).__name__, "evalue": str(error)}
    return {}


def _check(module, function):
    if not (module.startswith("dlcourse.checks.") and function.startswith("check_")):
        raise ValueError(f"{module}.{function} is not a check of dlcourse.checks")
    return getattr(importlib.import_module(module), function)


def _argument(arg, function):
    if "value" in arg:
        return arg["value"]
    with open(arg["file"], "rb") as f:
        payload = f.read(MAX_BYTES + 1)
    if len(payload) > MAX_BYTES:
        raise ValueError(f"the object given to {function} is over {MAX_BYTES:,} bytes")
    return Submitted(arg["name"], payload)


def _not_inspectable():
    """prctl(PR_SET_DUMPABLE, 0): a process without CAP_SYS_PTRACE (the sandbox's ranks) can
    neither trace this one nor read its memory, so the key stays here. Linux only."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


_PR_SET_DUMPABLE = 4  # from <linux/prctl.h>


if __name__ == "__main__":
    main()
