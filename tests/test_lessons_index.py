"""The course's one index of lessons (`dlcourse.lessons`, issue 32): the notebooks on disk, the
README's table and the packages' generated docstrings all agree with it."""

import re
from pathlib import Path

import dlcourse.parallel
import dlcourse.strategies
from dlcourse import cli
from dlcourse.lessons import LESSONS, lesson, listing

ROOT = Path(__file__).resolve().parent.parent


def test_every_lesson_notebook_is_in_the_index_and_no_other():
    on_disk = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "lessons").glob("*.ipynb"))
    assert on_disk == sorted(entry.notebook for entry in LESSONS)


def test_the_readme_table_lists_the_index_in_order():
    rows = re.findall(r"^\| (\d\d) \| \[([^\]]+)\]\(([^)]+)\) \|", (ROOT / "README.md").read_text(),
                      re.M)
    assert rows == [(e.number, e.title, e.notebook) for e in LESSONS]


def test_every_module_the_index_names_exists():
    for entry in LESSONS:
        for module, _ in entry.serves:
            path = ROOT.joinpath(*module.split("."))
            assert path.is_dir() or path.with_suffix(".py").is_file(), (entry.number, module)


def test_the_packages_docstrings_are_generated_from_the_index():
    for package in (dlcourse.parallel, dlcourse.strategies):
        table = listing(package.__name__)
        assert table in package.__doc__
        served = [m for e in LESSONS for m, _ in e.serves if m.startswith(package.__name__ + ".")]
        assert len(table.splitlines()) == 2 * len(served) > 0


def test_each_lesson_has_one_name_across_the_packages_that_serve_it():
    """dlcourse/checks/<name>/ for every lesson, and the per-lesson modules of strategies/,
    plots/ and benchmarks/ spelled with a lesson's name (or a concept of their own)."""
    names = {e.name for e in LESSONS}
    sets = {p.name for p in (ROOT / "dlcourse" / "checks").iterdir()
            if (p / "__init__.py").is_file()} - {"core", "hints"}
    assert sets == names
    own = {"strategies": {"catalogue", "config", "trainer"}, "plots": {"grid", "planner", "timeline"},
           "benchmarks": set()}  # not one lesson's: the catalogue's machinery, shared drawings
    for folder, extra in own.items():
        base = ROOT / folder if folder == "benchmarks" else ROOT / "dlcourse" / folder
        stems = {p.stem for p in base.glob("*.py")} - {"__init__"}
        assert stems <= names | extra, (folder, sorted(stems - names - extra))


def test_every_strategy_names_a_lesson_of_the_index_and_the_cli_counts_them(capsys):
    numbers = [e.number for e in LESSONS]
    assert all(s.lesson in numbers for s in dlcourse.strategies.STRATEGIES)
    assert cli.main(["lessons"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == numbers
    for entry, line in zip(LESSONS, printed):
        count = sum(s.lesson == entry.number for s in dlcourse.strategies.STRATEGIES)
        assert entry.notebook in line and (f"  {count} in the catalogue" in line) == (count > 0), line


def test_a_lesson_is_found_by_its_number_and_a_wrong_one_says_which_exist():
    assert lesson(3).notebook == "lessons/03_data_parallel.ipynb"
    assert lesson("10").slug == "debugging" and lesson("10").name == "debug"
    try:
        lesson(12)
    except ValueError as error:
        assert "00-11" in str(error)
    else:
        raise AssertionError("lesson(12) should raise")
