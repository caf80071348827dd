"""Issue 16's grading items: nothing a submission starts outlives its grading, even processes
that leave its session or process group (setsid, a double fork)."""

import csv
import os
import shutil
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from conftest import wait_gone
from dlcourse import cli
from dlcourse.grading import grade
from test_grading_cli import ROOT, _processes_marked

REFERENCE = ROOT / "exercises" / "00_launch.ipynb"

ESCAPES = """
import os, subprocess, time
subprocess.Popen(["sleep", "300"], start_new_session=True)  # a session of its own
if os.fork() == 0:  # a daemon: fork, setsid, fork again, and the middle one exits
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
os.wait()
"""


def test_processes_that_leave_the_submission_end_with_its_grading(tmp_path):
    grader = new_code_cell("assert True", metadata={"dlcourse": {"grader": "g", "points": 1}})
    nbformat.write(new_notebook(cells=[new_code_cell(ESCAPES), grader]),
                   str(tmp_path / "escape.ipynb"))
    marker = uuid.uuid4().hex  # every process the grading starts inherits it
    os.environ["DLCOURSE_TEST_MARK"] = marker
    try:
        submission = grade.grade_notebook(tmp_path / "escape.ipynb")
    finally:
        del os.environ["DLCOURSE_TEST_MARK"]
    try:
        assert submission.total == 1, submission  # the notebook ran to its grader
        assert not wait_gone(_processes_marked(marker), seconds=10)
    finally:
        for pid in _processes_marked(marker):
            os.kill(pid, 9)


def test_the_gradebook_is_written_as_it_goes_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.ipynb").write_text("not json")  # graded at once: no kernel
    book, graded = tmp_path / "gb.csv", []
    real = grade.grade_notebook

    def interrupted_at_c(path, *args):
        if path.name == "c.ipynb":
            raise KeyboardInterrupt  # the instructor's Ctrl-C, or the machine going down
        graded.append(path.name)
        return real(path, *args)

    monkeypatch.setattr(grade, "grade_notebook", interrupted_at_c)
    argv = ["grade", str(tmp_path), "--csv", str(book), "--against", str(REFERENCE)]
    with pytest.raises(KeyboardInterrupt):
        cli.main(argv)
    rows = list(csv.DictReader(open(book)))
    assert [Path(r["submission"]).name for r in rows] == ["a.ipynb", "b.ipynb"]

    monkeypatch.setattr(grade, "grade_notebook", lambda path, *args: (graded.append(path.name),
                                                                       real(path, *args))[1])
    assert cli.main(argv) == 1  # zero points everywhere
    assert graded == ["a.ipynb", "b.ipynb", "c.ipynb"]  # a and b were not graded again
    rows = list(csv.DictReader(open(book)))
    assert [Path(r["submission"]).name for r in rows] == ["a.ipynb", "b.ipynb", "c.ipynb"]
    assert all(r["possible"] == "7" and "not a readable notebook" in r["notes"] for r in rows)
    assert "its 2 row(s) are kept, 1 notebook(s) left to grade" in capsys.readouterr().out


TAMPER = """
import pathlib
outside = pathlib.Path({victim!r})
try:
    outside.write_text("changed by a submission")
except OSError as error:
    print("refused:", error)
"""


def test_a_submission_runs_sandboxed_and_the_gradebook_says_how(tmp_path, capsys):
    folder = tmp_path / "class"
    folder.mkdir()
    victim = tmp_path / "gradebook.csv"  # what a submission must not change: a file beside it
    victim.write_text("untouched")
    (folder / "other.ipynb").write_text("{}")  # another student's submission
    graders = [new_code_cell("assert True", metadata={"dlcourse": {"grader": "ran", "points": 1}}),
               new_code_cell(f"assert not pathlib.Path({str(folder / 'other.ipynb')!r}).exists()",
                             metadata={"dlcourse": {"grader": "hidden", "points": 1}})]
    nb = new_notebook(cells=[new_code_cell(TAMPER.format(victim=str(victim))), *graders])
    nbformat.write(nb, str(folder / "tamper.ipynb"))
    cli.main(["grade", str(folder / "tamper.ipynb"), "--csv", str(tmp_path / "gb.csv")])
    row = next(csv.DictReader(open(tmp_path / "gb.csv")))
    assert row["ran"] == "1"  # the notebook itself ran
    if shutil.which("bwrap"):  # installed: the sandbox must hold (CI installs it)
        assert row["isolation"] == "bubblewrap"
        assert victim.read_text() == "untouched"
        assert row["hidden"] == "1", row["notes"]
    else:
        assert row["isolation"] == "none"
        assert "WARNING: no sandbox" in capsys.readouterr().err
