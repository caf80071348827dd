"""Issue 16's grading items: nothing a submission starts outlives its grading, even processes
that leave its session or process group (setsid, a double fork). Issue 28's: a class graded from
a venv under /tmp gets its points, and a machine that cannot start a kernel stops the grading
instead of writing a 0 for every student."""

import csv
import os
import shutil
import site
import subprocess
import sys
import tempfile
import uuid
import venv
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from conftest import wait_gone
from dlcourse import cli
from dlcourse.grading import grade, nbrun, sandbox
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
        assert row["isolation"] == sandbox.described()  # "bubblewrap", ", ranks sharing /tmp"
        assert row["isolation"].startswith("bubblewrap")  # where a rank cannot have its own
        assert victim.read_text() == "untouched"
        assert row["hidden"] == "1", row["notes"]
    else:
        assert row["isolation"] == "none"
        assert "WARNING: no sandbox" in capsys.readouterr().err


PASSES = new_code_cell("assert True", metadata={"dlcourse": {"grader": "ran", "points": 1}})


def test_a_class_graded_from_a_venv_under_tmp_gets_its_points(tmp_path):
    with tempfile.TemporaryDirectory(dir="/tmp") as where:  # what the sandbox's /tmp hides
        venv.create(where, symlinks=True)  # no pip: 0.1 s
        _sees_this_interpreters_packages(Path(where))
        nbformat.write(new_notebook(cells=[PASSES]), str(tmp_path / "good.ipynb"))
        book = tmp_path / "gb.csv"
        done = subprocess.run([str(Path(where, "bin", "python")), "-m", "dlcourse.cli", "grade",
                               str(tmp_path / "good.ipynb"), "--csv", str(book)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr  # 3: the kernel could not start in the sandbox
    row = next(csv.DictReader(open(book)))
    assert row["ran"] == "1", row["notes"]
    assert row["isolation"] == sandbox.described()


def _sees_this_interpreters_packages(where):
    """Give the venv at `where` the packages of the interpreter running the tests: a venv is
    built on the base interpreter, whose site-packages lack the course's dependencies when the
    tests themselves run in a venv (the README's `pip install -e .` inside one). A .pth line
    that starts with `import` runs at startup; `addsitedir` reads that folder's .pth files too."""
    [packages] = where.glob("lib/python*/site-packages")
    folders = [p for p in site.getsitepackages() + [site.getusersitepackages()]
               if Path(p).is_dir()]
    (packages / "dlcourse-tests.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in folders))


def test_a_kernel_that_cannot_start_stops_the_class_without_writing_zeros(tmp_path, monkeypatch,
                                                                          capsys):
    for name in ("a", "b"):
        nbformat.write(new_notebook(cells=[PASSES]), str(tmp_path / f"{name}.ipynb"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))  # as a hidden venv is
    book = tmp_path / "gb.csv"
    assert cli.main(["grade", str(tmp_path), "--csv", str(book)]) == 3
    first = capsys.readouterr().err.strip().splitlines()[-1]  # after a no-sandbox warning
    assert first.startswith("dlcourse grade: STOPPED, nothing more graded: a kernel cannot "
                            "start"), first
    assert "no-python" in first  # the cause, as the failed start said it
    assert not book.exists()  # no row of zeros for a or b


KILLS_ITS_GRADER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)  # pytest, nbval"


def test_a_submission_that_kills_its_run_gets_0_and_the_class_goes_on(tmp_path):
    """Nothing of it ran, as when a kernel cannot start; the probe starts one, so the fault is
    the submission's: it gets its 0 and its row (exit 1), and grading does not stop (exit 3)."""
    nbformat.write(new_notebook(cells=[new_code_cell(KILLS_ITS_GRADER), PASSES]),
                   str(tmp_path / "a.ipynb"))
    assert cli.main(["grade", str(tmp_path / "a.ipynb"), "--csv", str(tmp_path / "gb.csv")]) == 1
    row = next(csv.DictReader(open(tmp_path / "gb.csv")))
    assert row["ran"] == "0" and "nbval ran no cell" in row["notes"], row["notes"]


LOOK = "import os, sys; print(sorted(os.listdir(sys.argv[1])), os.path.exists(sys.argv[2]))"


@pytest.mark.skipif(not shutil.which("bwrap"), reason="the sandbox needs bubblewrap")
def test_python_inside_the_class_folder_is_bound_back_and_nothing_else(tmp_path, monkeypatch):
    folder = tmp_path / "class"  # the cwd of `dlcourse grade .`, with a venv in it
    (folder / "venv").mkdir(parents=True)
    (folder / "venv" / "site.py").write_text("")
    (folder / "other.ipynb").write_text("{}")  # another student's submission
    monkeypatch.setattr(sys, "path", [*sys.path, str(folder), str(folder / "venv")])
    work = tmp_path / "work"
    work.mkdir()
    returncode, output = nbrun.Run(str(work), str(work), folder)(
        [sys.executable, "-c", LOOK, str(folder), str(folder / "venv" / "site.py")], 30)
    assert (returncode, output.split()) == (0, ["['venv']", "True"]), output
