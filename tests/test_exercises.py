"""Every exercise set, found by globbing: `exercises/` holds exactly what the build makes of
`solutions/`, and an unsolved exercise notebook fails at its grader cells and nowhere else.
(The solved notebooks themselves run under nbval with the rest of the suite.)"""

from pathlib import Path

import pytest

from dlcourse.grading.build import exercise_notebook
from dlcourse.grading.nbrun import run_cells
from dlcourse.grading.notebooks import grader_cells, read
from dlcourse.lessons import lesson

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def test_every_solution_has_an_exercise_notebook_and_no_exercise_is_orphaned():
    assert SOLUTIONS, "no solutions/*.ipynb: the exercise sets are missing"
    assert [p.name for p in EXERCISES] == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_the_exercise_notebook_is_the_build_of_its_solution(solution):
    exercise = ROOT / "exercises" / solution.name
    assert exercise.read_text(encoding="utf-8") == exercise_notebook(solution), (
        f"{exercise.name} differs from what its solution builds: run `dlcourse exercises build`")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda p: p.name)
def test_an_unsolved_notebook_fails_exactly_at_its_grader_cells(exercise):
    nb = read(exercise)
    graders = {g.code_cell for g in grader_cells(nb)}
    code_cells = sum(1 for cell in nb.cells if cell.cell_type == "code")
    assert graders, f"{exercise.name} has no grader cells"
    cells, problem = run_cells(exercise)
    assert problem == ""
    assert sorted(cells) == list(range(code_cells)), "nbval did not report every code cell"
    for index, cell in sorted(cells.items()):
        if index in graders:
            # It fails because of the stub, with the check's message, not some other error.
            assert cell["outcome"] == "failed", f"grader cell {index} passed an unsolved exercise"
            assert "not written yet" in cell["reason"] or "NotImplementedError" in cell["reason"], \
                f"grader cell {index} failed for another reason: {cell['reason']}"
        else:
            assert cell["outcome"] == "passed", f"code cell {index} failed: {cell['reason']}"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_grader_cells_call_the_check_module_named_after_their_notebook(solution):
    """solutions/NN_topic.ipynb's grader cells import their checks from dlcourse.checks.<name>,
    the lesson's one name in the index (and its last cell `check_all` from
    dlcourse.checks.summary, which runs them all)."""
    topic = lesson(solution.stem.split("_", 1)[0]).name
    nb = read(solution)
    imported = {line.split()[1] for cell in nb.cells if cell.cell_type == "code"
                for line in cell.source.splitlines() if line.startswith("from dlcourse.checks")}
    imported.discard("dlcourse.checks.summary")
    assert imported == {f"dlcourse.checks.{topic}"}, (
        f"{solution.name} imports its checks from {sorted(imported)}; "
        f"expected dlcourse.checks.{topic} only")


def test_the_library_never_imports_the_checks():
    """Checks refuse library functions while a student's code runs; the library must not need
    them (nor the grading engine, which runs notebooks and reads their results)."""
    for path in (ROOT / "dlcourse").rglob("*.py"):
        if "checks" in path.relative_to(ROOT / "dlcourse").parts:
            continue
        if path == ROOT / "dlcourse" / "translate.py":
            continue  # the translator's build reads the hint tables into catalogues; no rank,
            # check or graded kernel imports it (test_the_i18n_build_stays_a_tool says so)
        text = path.read_text(encoding="utf-8")
        assert "import dlcourse.checks" not in text and "from dlcourse.checks" not in text, path


def test_the_i18n_build_stays_a_tool():
    """The one library file allowed to read the checks (the hint tables) is the translation
    build; only the instructor's commands (`dlcourse translate`, inside its function) may
    import it, or the checks would come with the library."""
    for path in (ROOT / "dlcourse").rglob("*.py"):
        if path.name in ("translate.py", "instructor.py") and path.parent.name == "dlcourse":
            continue
        text = path.read_text(encoding="utf-8")
        assert "dlcourse.translate" not in text and "import translate" not in text, path


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_every_exercise_notebook_ends_with_check_all_for_itself(solution):
    last = [c for c in read(solution).cells if c.cell_type == "code"][-1]
    assert f'check_all(globals(), "{solution.stem}")' in last.source, (
        f"{solution.name}: end with a cell calling check_all(globals(), \"{solution.stem}\")")


def _stub_hints(solution):
    """{exercise (the top-level function or class): [its regions' `### HINT:` texts]}."""
    found = {}
    for cell in read(solution).cells:
        if cell.cell_type != "code" or "### HINT:" not in cell.source:
            continue
        name = None
        for line in cell.source.splitlines():
            if line.startswith(("def ", "class ")):  # not indented: the exercise itself
                name = line.split()[1].split("(")[0].rstrip(":")
            if "### HINT:" in line:
                found.setdefault(name, []).append(line.split("### HINT:", 1)[1].strip())
    return found


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_each_stub_hint_is_the_first_level_of_its_exercises_hints(solution):
    """...in the table of the notebook's own set, dlcourse/checks/<name>/hints.py."""
    from dlcourse.checks.hints import of_set
    topic = lesson(solution.stem.split("_", 1)[0]).name
    HINTS = of_set(topic)
    for name, texts in _stub_hints(solution).items():
        assert name in HINTS, (f"{solution.name}: {name} has no levels in "
                               f"dlcourse/checks/{topic}/hints.py")
        assert set(texts) == {HINTS[name][0]}, f"{solution.name}: {name}'s stub hint is not level 1"
        assert len(HINTS[name]) >= 2, f"{name}: give at least one level beyond the stub"
