"""Every exercise of a notebook checked at once, from inside it (otter-grader's `check_all()`).

Under Run All a notebook stops at the first grader cell that fails, so a student sees one
message. The last cell of each exercise notebook calls

    from dlcourse.checks.summary import check_all
    check_all(globals(), "00_launch")

which runs each grader cell of the released `exercises/00_launch.ipynb` (its code and points,
read with the grading engine's `grader_cells`) against the functions defined in this kernel,
and prints one table: exercise, points, and the first line of each failure. Nothing stops at a
failure, and the grader cells themselves stay as they are for `dlcourse grade`. A grader whose
cell has already passed with the same functions is not run again (`core.cases.reuse_passes`):
after Run All the table costs nothing, and a function defined again is checked afresh.
"""

import contextlib
import io
import json
from pathlib import Path

from dlcourse.checks.core.cases import reuse_passes
from dlcourse.grading.text import trim
from dlcourse.grading.notebooks import grader_cells

COURSE = Path(__file__).resolve().parents[2]  # the course folder: exercises/ is here


def check_all(namespace, notebook, out=print):
    """Run every grader of exercises/<notebook>.ipynb with `namespace` (the notebook's globals);
    print and return [(exercise, points earned, points possible, first line or 'passed')]."""
    path = COURSE / "exercises" / f"{notebook}.ipynb"
    if not path.exists():  # a typo, or a sandbox that shows only the package (`dlcourse grade`)
        out(f"check_all: no exercise notebook {path} here, so nothing to check; name it as in "
            "exercises/, e.g. check_all(globals(), '00_launch')")
        return []
    with open(path, encoding="utf-8") as f:  # the course's own notebook: plain JSON will do
        nb = json.load(f)
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    rows = [_run(g, code[g.code_cell], namespace) for g in grader_cells(nb)]
    out(format_rows(rows))
    return rows


def _run(grader, source, namespace):
    """One grader cell's code, in a copy of the student's globals, its printing kept quiet. A
    check that already passed in this kernel with the very functions named here is not run
    again (`reuse_passes`): its row says it passed in its cell."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), reuse_passes() as calls:
            exec(compile(source, f"<grader {grader.exercise}>", "exec"), dict(namespace))
    except NameError as error:
        return (grader.exercise, 0, grader.points,
                f"{error}: run the cell that defines it first")
    except Exception as error:  # a CheckFailed, or the student's own error
        first = (str(error).splitlines() or [type(error).__name__])[0]
        return grader.exercise, 0, grader.points, first
    if calls["reused"] and not calls["run"]:
        return grader.exercise, grader.points, grader.points, PASSED_IN_ITS_CELL
    return grader.exercise, grader.points, grader.points, "passed"


PASSED_IN_ITS_CELL = "passed in its cell above (same function: not run again)"


def format_rows(rows, width=100):
    """The table: one line per exercise, the failure's first line cut to fit at a word, then
    the total."""
    name = max([len("exercise")] + [len(r[0]) for r in rows])
    lines = [f"{'exercise'.ljust(name)}  points  result"]
    for exercise, got, possible, result in rows:
        text = trim(result, width - name - 10)  # cut at a word, as the gradebook does
        lines.append(f"{exercise.ljust(name)}  {got:>2} / {possible:<2} {text}")
    total, possible = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"{'total'.ljust(name)}  {total:>2} / {possible:<2}")
    return "\n".join(lines)
