"""`dlcourse grade` on a class folder: a good, a partial and every kind of bad submission in one
call, each with its row in the gradebook; a loop and a notebook past its time limit are stopped
with nothing left running."""

import contextlib
import copy
import csv
import io
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from conftest import wait_gone
from dlcourse import cli
from dlcourse.grading import grade, gradebook, nbresults, nbrun, text

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = nbformat.read(str(ROOT / "solutions" / "00_launch.ipynb"), as_version=4)
EXERCISE = nbformat.read(str(ROOT / "exercises" / "00_launch.ipynb"), as_version=4)


def _cell(nb, text):
    return next(c for c in nb.cells if c.cell_type == "code" and text in c.source)


def _submission(folder, name, base, edit=None):
    nb = copy.deepcopy(base)
    if edit:
        edit(nb)
    nbformat.write(nb, str(folder / name))


def _solve(nb, function):
    _cell(nb, f"def {function}(").source = _cell(SOLUTION, f"def {function}(").source


def _syntax_error_one_solved_and_a_check_edited(nb):
    _solve(nb, "sum_to_rank0")
    _cell(nb, "def gather_all(").source = "def gather_all(x)\n    return x"  # missing colon
    edited = _cell(nb, "check_gather_all(gather_all)")  # the student "fixes" the grader cell
    edited.source, edited.metadata["dlcourse"]["points"] = 'print("passed")', 30
    edited.metadata["tags"] = ["raises-exception"]  # nbval would pass it even when it raises


def _crash_first(nb):
    nb.cells[1].source = "import os\nos._exit(3)  # the kernel dies\n" + nb.cells[1].source


def _no_graders(nb):
    nb.cells = [c for c in nb.cells if "dlcourse" not in c.metadata]


def _grade(*argv, marker):
    """Run `dlcourse grade` in this process; return (exit code, stdout). Every process it starts
    inherits `marker` in its environment, so the test can find any that outlive it."""
    out = io.StringIO()
    os.environ["DLCOURSE_TEST_MARK"] = marker
    try:
        with contextlib.redirect_stdout(out):
            code = cli.main(["grade", *map(str, argv)])
    finally:
        del os.environ["DLCOURSE_TEST_MARK"]
    return code, out.getvalue()


def _processes_marked(marker):
    """Processes carrying `marker`, except this test process and its own children."""
    found = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            marked = marker.encode() in (folder / "environ").read_bytes()
            parent = int((folder / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue  # gone while we looked, or not ours to read
        if marked and os.getpid() not in (int(folder.name), parent):
            found.append(int(folder.name))
    return found


@pytest.fixture(scope="module")
def class_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    _submission(folder, "good.ipynb", SOLUTION)
    _submission(folder, "partial.ipynb", EXERCISE, _syntax_error_one_solved_and_a_check_edited)
    _submission(folder, "crash.ipynb", EXERCISE, _crash_first)
    _submission(folder, "no_graders.ipynb", SOLUTION, _no_graders)
    (folder / "not_json.ipynb").write_text('{"cells": [ {"cell_type": "code", ', encoding="utf-8")
    gradebook, marker = folder / "gradebook.csv", uuid.uuid4().hex
    code, out = _grade(folder, "--csv", gradebook, "--cell-timeout", 45,
                       "--against", ROOT / "exercises" / "00_launch.ipynb", marker=marker)
    rows = {Path(r["submission"]).name: r for r in csv.DictReader(open(gradebook))}
    return code, out, rows, list(csv.reader(open(gradebook)))[0], marker


def test_the_gradebook_has_a_row_per_submission_and_a_column_per_exercise(class_results):
    code, out, rows, header, _ = class_results
    assert header == ["submission", "gather_all", "sum_to_rank0", "total", "possible", "notes",
                      "isolation"]
    assert sorted(rows) == ["crash.ipynb", "good.ipynb", "no_graders.ipynb", "not_json.ipynb",
                            "partial.ipynb"]
    assert code == 1  # not every submission has full points
    assert "5 notebook(s) graded, 1 with full points" in out


def _points(row):
    return [int(row[k]) for k in ("gather_all", "sum_to_rank0", "total", "possible")]


def test_good_and_partial_submissions_get_their_points(class_results):
    _, out, rows, _, _ = class_results
    # Full points from the verdict process (`--against`): no note that a grader was judged in
    # the notebook's own kernel, nor any other.
    assert _points(rows["good.ipynb"]) == [3, 4, 7, 7] and rows["good.ipynb"]["notes"] == ""
    # The edited check, its points and its raises-exception tag all count for nothing.
    assert _points(rows["partial.ipynb"]) == [0, 4, 4, 7]
    assert "SyntaxError" in rows["partial.ipynb"]["notes"]  # the cause, not only the NameError
    assert re.search(r"gather_all\s+0 / 3\s+failed\s+NameError: name 'gather_all' is not", out)
    assert re.search(r"sum_to_rank0\s+4 / 4\s+passed", out)
    assert "good.ipynb: 7 / 7 points" in out and "partial.ipynb: 4 / 7 points" in out


@pytest.mark.parametrize("name, says", [
    ("crash.ipynb", "the kernel died while running this cell"),
    ("no_graders.ipynb", "no grader cells"),
    ("not_json.ipynb", "not a readable notebook (NotJSONError"),
])
def test_a_bad_submission_gets_a_row_of_zeros_with_the_reason(class_results, name, says):
    _, _, rows, _, _ = class_results
    assert _points(rows[name]) == [0, 0, 0, 7]
    assert says in rows[name]["notes"]


def test_a_crashed_kernel_is_noticed_at_once_not_at_the_cell_time_limit(class_results):
    _, out, _, _, _ = class_results
    seconds = float(re.search(r"crash\.ipynb: 0 points, graded in ([\d.]+) s", out).group(1))
    assert seconds < 45, "the grader waited for the cell time limit instead of the dead kernel"


def test_grading_a_class_leaves_no_process(class_results):
    assert not wait_gone(_processes_marked(class_results[4]), seconds=10)


def test_a_loop_is_stopped_at_the_cell_limit_and_graded_zero(tmp_path):
    def loop_then_graders(nb):  # a student's stray loop, then the graders it never lets run
        graders = [c for c in nb.cells if "dlcourse" in c.metadata]
        nb.cells = [new_code_cell("while True:\n    pass")] + graders

    _submission(tmp_path, "loop.ipynb", SOLUTION, loop_then_graders)
    marker, start = uuid.uuid4().hex, time.monotonic()
    code, out = _grade(tmp_path, "--csv", tmp_path / "gb.csv", "--cell-timeout", 3, marker=marker)
    assert time.monotonic() - start < 60
    row = next(csv.DictReader(open(tmp_path / "gb.csv")))
    assert _points(row) == [0, 0, 0, 7] and code == 1
    assert "code cell 0 failed: Timeout of 3 seconds exceeded" in row["notes"]
    assert not wait_gone(_processes_marked(marker), seconds=10)


def test_a_notebook_past_its_time_limit_is_killed_with_all_it_started(tmp_path):
    nb = copy.deepcopy(SOLUTION)
    # Ranks that would sleep for 10 minutes (if the machine starts them within the limit): the
    # limit must take down pytest, the kernel and whatever the kernel started.
    nb.cells.insert(2, new_code_cell('import time\ndlcourse.launch(time.sleep, 600, world_size=2, '
                                     'backend="gloo", timeout=900)'))
    nbformat.write(nb, str(tmp_path / "slow.ipynb"))
    marker, start = uuid.uuid4().hex, time.monotonic()
    code, out = _grade(tmp_path, "--csv", tmp_path / "gb.csv", "--notebook-timeout", 10,
                       marker=marker)
    assert time.monotonic() - start < 40
    row = next(csv.DictReader(open(tmp_path / "gb.csv")))
    assert _points(row) == [0, 0, 0, 7]
    assert "not reached: the notebook ran past its 10 s time limit" in row["notes"]
    assert not wait_gone(_processes_marked(marker), seconds=10)


def test_a_class_of_unreadable_notebooks_still_gets_the_reference_columns(tmp_path, capsys):
    (tmp_path / "a.ipynb").write_text("not json")
    (tmp_path / "b.ipynb").write_text('{"cells": "not a list"}')
    code = cli.main(["grade", str(tmp_path), "--csv", str(tmp_path / "gb.csv"),
                     "--against", str(ROOT / "exercises" / "00_launch.ipynb")])
    rows = list(csv.DictReader(open(tmp_path / "gb.csv")))
    assert code == 1 and [Path(r["submission"]).name for r in rows] == ["a.ipynb", "b.ipynb"]
    assert all(_points(r) == [0, 0, 0, 7] and "not a readable notebook" in r["notes"] for r in rows)
    assert "a.ipynb: 0 / 7 points" in capsys.readouterr().out


def test_restoring_graders_undoes_edits_and_unmarks_strays():
    nb = copy.deepcopy(EXERCISE)
    _syntax_error_one_solved_and_a_check_edited(nb)
    stray = new_code_cell("assert True", metadata={"dlcourse": {"grader": "bonus", "points": 99}})
    copied = copy.deepcopy(_cell(nb, "check_sum_to_rank0(sum_to_rank0)"))
    copied.source = "pass"
    nb.cells += [stray, copied]
    grade.restore_graders(nb, EXERCISE)
    marks = [(c.metadata["dlcourse"], c.source) for c in nb.cells if "dlcourse" in c.metadata]
    official = [(c.metadata["dlcourse"], c.source)
                for c in EXERCISE.cells if "dlcourse" in c.metadata]
    assert marks == official  # the edited one restored; the stray and the copy grade nothing


KERNEL_LIKE = """
import subprocess, sys, time
if sys.argv[1] == "root":  # starts a "kernel" in a session of its own, as jupyter_client does
    subprocess.Popen([sys.executable, __file__, "kernel"], start_new_session=True)
elif sys.argv[1] == "kernel":  # which starts a "rank" and says which
    print(subprocess.Popen([sys.executable, __file__, "rank"]).pid, flush=True)
time.sleep(60)
"""


def test_kill_tree_reaches_a_child_in_a_session_of_its_own(tmp_path):
    (tmp_path / "tree.py").write_text(KERNEL_LIKE)
    root = subprocess.Popen([sys.executable, str(tmp_path / "tree.py"), "root"],
                            stdout=subprocess.PIPE, text=True)
    grandchild = int(root.stdout.readline())
    nbrun._kill_tree(root.pid)
    root.wait(timeout=10)
    assert not wait_gone([grandchild], seconds=10)


def test_folders_are_searched_and_missing_paths_refused(tmp_path, capsys):
    (tmp_path / "a" / ".ipynb_checkpoints").mkdir(parents=True)
    for name in ("a/x.ipynb", "a/.ipynb_checkpoints/x-checkpoint.ipynb", "b.ipynb", "c.txt"):
        (tmp_path / name).write_text("{}")
    assert grade.find_notebooks([tmp_path]) == [tmp_path / "a" / "x.ipynb", tmp_path / "b.ipynb"]
    assert cli.main(["grade", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "b.ipynb"), "--against", str(tmp_path / "c.txt")]) == 2
    assert "not a readable notebook" in capsys.readouterr().err


HINT = ("every rank must end with the same tensor: rank r's x in row r, so gather into a list "
        "of world_size buffers, one per rank, and stack them in rank order before returning it")


def test_the_gradebook_keeps_the_hint_trimmed_at_a_word():
    message = f"gather_all: rank 1 returned wrong values\nHint: {HINT}\n\nTraceback ..."
    reason = nbresults.reason_of("CheckFailed", message)
    assert reason.startswith("CheckFailed: gather_all: rank 1 returned wrong values Hint: every")
    assert "Traceback" not in reason
    short = text.trim(HINT, 60)
    assert len(short) <= 60 and short.endswith("...")
    assert HINT.startswith(short[:-3]) and HINT[len(short) - 3] in " ,;:"  # cut where a word ends
    assert text.trim("x" * 80, 60) == "x" * 57 + "..."  # one long word: cut, still marked


def test_the_table_cuts_a_long_failure_line_at_a_word():
    failure = "gather_all: rank 1 returned wrong values in chunk 0 Hint: " + HINT
    sub = grade.Submission("a.ipynb", [grade.Result("gather_all", 3, 0, failure)])
    row = gradebook.table(sub)[-1]
    shown = row.split("failed  ", 1)[1]
    assert shown.endswith("...") and len(shown) <= gradebook.REASON_WIDTH
    assert failure.startswith(shown[:-3]) and failure[len(shown) - 3] in " ,;:"
