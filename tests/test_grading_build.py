"""`dlcourse exercises build`: solution regions become stubs, nothing else changes, same bytes
every time, and an author's mistake is refused with the cell and line."""

import textwrap

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dlcourse import cli
from dlcourse.grading.build import BuildError, build, exercise_notebook, stub_source
from dlcourse.grading.notebooks import GraderMarkError, grader_cells

SOLVED = textwrap.dedent('''\
    import math

    class Ring:
        def step(self, x):
            """Keep this docstring."""
            ### BEGIN SOLUTION
            ### HINT: send right, receive from the left
            y = x + 1
            return y
            ### END SOLUTION

    def area(r):
        ### BEGIN SOLUTION
        return math.pi * r * r
        ### END SOLUTION
    ''')


def test_each_region_becomes_a_stub_at_its_indentation_with_its_hint():
    stubbed = stub_source(SOLVED)
    assert stubbed == textwrap.dedent('''\
        import math

        class Ring:
            def step(self, x):
                """Keep this docstring."""
                # YOUR CODE HERE
                raise NotImplementedError("Hint: send right, receive from the left")

        def area(r):
            # YOUR CODE HERE
            raise NotImplementedError("Hint: write this part of the exercise")
        ''')


def test_the_stub_runs_and_raises_the_hint():
    scope = {}
    exec(stub_source(SOLVED), scope)
    with pytest.raises(NotImplementedError, match="send right, receive from the left"):
        scope["Ring"]().step(1)


def test_a_hint_with_quotes_stays_valid_python():
    source = '    ### BEGIN SOLUTION\n    ### HINT: use "dst=0" and a \\ here\n    ### END SOLUTION'
    scope = {}
    exec("def f():\n" + stub_source(source), scope)
    with pytest.raises(NotImplementedError) as raised:
        scope["f"]()
    assert str(raised.value) == 'Hint: use "dst=0" and a \\ here'


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a ### BEGIN SOLUTION"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "line 2: ### BEGIN SOLUTION in"),
    ("### HINT: where am I\nx = 1", "line 1: ### HINT: must be inside a region"),
    ("### BEGIN SOLUTION\n### HINT: a\n### HINT: b\n### END SOLUTION", "line 3: ### HINT:"),
])
def test_malformed_regions_are_refused_naming_the_line(source, problem):
    with pytest.raises(BuildError, match=problem):
        stub_source(source, where="sol.ipynb: code cell 3")


def _solution(tmp_path, cells, name="00_demo.ipynb"):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "solutions" / name
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def _grader(exercise, points, source="check(f)"):
    cell = new_code_cell(source)
    cell.metadata["dlcourse"] = {"grader": exercise, "points": points}
    return cell


def _executed(source):
    cell = new_code_cell(source, execution_count=7)
    cell.outputs = [new_output("stream", name="stdout", text="ran\n")]
    return cell


def test_outputs_are_cleared_and_everything_else_is_kept(tmp_path):
    text = new_markdown_cell("# Title\n### BEGIN SOLUTION is only text here")
    solved = _executed(SOLVED)
    solved.metadata["tags"] = ["keep-me"]
    path = _solution(tmp_path, [text, solved, _grader("area", 2)])
    nb = nbformat.reads(exercise_notebook(path), as_version=4)
    original = nbformat.read(str(path), as_version=4)
    assert nb.cells[0] == original.cells[0]  # markdown untouched, markers in text included
    assert nb.cells[1].source == stub_source(SOLVED)
    assert (nb.cells[1].outputs, nb.cells[1].execution_count) == ([], None)
    assert nb.cells[1].metadata == {"tags": ["keep-me"]} and nb.cells[1].id == original.cells[1].id
    assert nb.cells[2] == original.cells[2]  # the grader cell, metadata and all
    assert nb.metadata == original.metadata


def test_the_same_solution_gives_the_same_bytes_whatever_its_outputs(tmp_path):
    path = _solution(tmp_path, [_executed(SOLVED), _grader("area", 2)])
    first = exercise_notebook(path)
    assert exercise_notebook(path) == first
    rerun = nbformat.read(str(path), as_version=4)
    rerun.cells[0].outputs, rerun.cells[0].execution_count = [], 99  # run again, other outputs
    rerun.cells[0].metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    nbformat.write(rerun, str(path))
    assert exercise_notebook(path) == first


@pytest.mark.parametrize("cells, problem", [
    ([new_code_cell("x = 1"), _grader("a", 1)], "no ### BEGIN SOLUTION region"),
    ([_grader("a", 1, "### BEGIN SOLUTION\nx\n### END SOLUTION")], "grader cell; it cannot hold"),
])
def test_a_solution_that_would_leak_or_break_a_grader_is_refused(tmp_path, cells, problem):
    with pytest.raises(BuildError, match=problem):
        exercise_notebook(_solution(tmp_path, cells))


@pytest.mark.parametrize("mark, problem", [
    ({"grader": "a", "points": "3"}, "points must be a whole number"),
    ({"grader": "a", "points": True}, "points must be a whole number"),
    ({"grader": "a", "points": -1}, "points must be a whole number"),
    ({"grader": "", "points": 1}, "grader must be the exercise id"),
])
def test_malformed_grader_metadata_is_refused(mark, problem):
    cell = new_code_cell("check(f)")
    cell.metadata["dlcourse"] = mark
    with pytest.raises(GraderMarkError, match=problem):
        grader_cells(new_notebook(cells=[cell]))


def test_two_graders_for_one_exercise_are_refused_and_others_are_read_in_order():
    cells = [_grader("b", 2), new_code_cell("x = 1"), _grader("a", 1)]
    assert [(g.exercise, g.points, g.code_cell) for g in grader_cells(new_notebook(cells=cells))] \
        == [("b", 2, 0), ("a", 1, 2)]
    with pytest.raises(GraderMarkError, match="code cells 0 and 1 both grade 'a'"):
        grader_cells(new_notebook(cells=[_grader("a", 1), _grader("a", 2)]))


def test_build_writes_and_check_reports_drift_without_writing(tmp_path, capsys):
    path = _solution(tmp_path, [_executed(SOLVED), _grader("area", 2)])
    target = tmp_path / "exercises" / path.name
    assert [b.changed for b in build([path])] == [True] and target.is_file()
    assert [b.changed for b in build([path], check=True)] == [False]
    target.write_text(target.read_text().replace("YOUR CODE HERE", "edited by hand"))
    assert cli.main(["exercises", "build", "--check", str(path)]) == 1
    assert "OUT OF DATE" in capsys.readouterr().out
    assert "edited by hand" in target.read_text()  # --check wrote nothing
    assert cli.main(["exercises", "build", str(path)]) == 0
    assert target.read_text() == exercise_notebook(path)


def test_build_reports_a_broken_solution_and_exits_2(tmp_path, capsys):
    path = _solution(tmp_path, [new_code_cell("### BEGIN SOLUTION\nx = 1"), _grader("a", 1)])
    assert cli.main(["exercises", "build", str(path)]) == 2
    assert "code cell 0" in capsys.readouterr().err
