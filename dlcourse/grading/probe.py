"""The machine or the submission? When nothing of a submission ran (no cell's result came back,
or its kernel never started), `dlcourse grade` starts a kernel on a notebook of one cell written
by the grader, in the same sandbox; when its checking process gave no verdict, it gives that
process an empty job. If the probe fails too, no student is to blame: the grading stops with
`CannotGrade`, rather than writing a 0 for every student of a class (a venv under /tmp hidden
by the sandbox did just that). If it passes, the submission keeps its 0 and the reason.
"""

import tempfile
from pathlib import Path

from nbformat.v4 import new_code_cell, new_notebook

from dlcourse.grading import verdicts
from dlcourse.grading.nbrun import Run, run_cells

PROBE = "import dlcourse"  # what every grader's kernel imports; light (torch comes later)


class CannotGrade(RuntimeError):
    """A submission could not be graded for a reason that is not its own: a kernel cannot start
    here, or the checking process cannot run. Its message is one line that says which and why."""


def kernel_starts(folder, cell_timeout, notebook_timeout):
    """Raise CannotGrade unless a kernel starts and runs `PROBE` in the sandbox a notebook of
    `folder` runs in."""
    nb = new_notebook(cells=[new_code_cell(PROBE)])
    cells, problem = run_cells(Path(folder, "dlcourse-probe.ipynb"), cell_timeout,
                               notebook_timeout, nb=nb, sandbox=True)
    cell = cells.get(0, {})
    if cell.get("outcome") != "passed":
        why = problem or cell.get("reason") or "no result"
        raise CannotGrade(f"a kernel cannot start and run `{PROBE}` in the grading sandbox "
                          f"({why})")


def checking_process_runs(folder, seconds):
    """Raise CannotGrade unless the checking process (`python -m dlcourse.checks.core.verdict`),
    started in the sandbox a notebook of `folder` runs in, answers an empty job with its signed
    line."""
    with tempfile.TemporaryDirectory(prefix="dlcourse-probe-") as tmp:
        stdin, key = verdicts.job({}, tmp)
        returncode, output = Run(tmp, tmp, Path(folder))(verdicts.command(), seconds, stdin)
    if verdicts.read(key, output) is None:
        tail = [line for line in output.splitlines() if line.strip()][-1:] or ["no output"]
        raise CannotGrade(f"the checking process cannot run in the grading sandbox (exit "
                          f"{returncode}: {tail[0]})")
