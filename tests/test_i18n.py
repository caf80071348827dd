"""The Chinese edition (dlcourse/i18n/): every English markdown cell of a translated notebook has
a current translation, the built notebooks are what the build makes, their code cells and outputs
are the English ones byte for byte, their links resolve, hints come in Chinese in a Chinese
notebook and in `dlcourse grade` of one. The text itself (terms, numbers, code): test_i18n_text.py."""

import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from dlcourse import cli, i18n
from dlcourse.checks import hints
from dlcourse.checks.core.stubs import not_written
from dlcourse import translate as build
from dlcourse.i18n import catalog
from dlcourse.translate import hints_of

COURSE = Path(__file__).resolve().parent.parent
TRANSLATED = catalog.translated_notebooks(COURSE)
IDS = [f"{p.parent.name}/{p.stem}" for p in TRANSLATED]


def test_lessons_00_to_06_and_their_exercises_are_translated():
    names = {f"{p.parent.name}/{p.stem[:2]}" for p in TRANSLATED}
    assert {f"{kind}/0{n}" for kind in catalog.KINDS for n in range(7)} <= names


@pytest.mark.parametrize("notebook", TRANSLATED, ids=IDS)
def test_every_markdown_cell_and_hint_has_a_current_translation(notebook):
    missing = build.check(notebook, catalog.load(catalog.catalogue_path(notebook)))
    assert not missing, (f"{notebook.parent.name}/{notebook.name}: no current translation for "
                         + "; ".join(map(str, missing))
                         + ". Run `dlcourse translate update`, translate, then "
                           "`dlcourse translate build`")


@pytest.mark.parametrize("notebook", TRANSLATED, ids=IDS)
def test_the_built_notebook_is_what_the_build_makes(notebook):
    target = build.output_path(notebook)
    expected = build.translated_notebook(notebook)
    assert target.is_file() and target.read_text(encoding="utf-8") == expected, (
        f"{target.relative_to(COURSE)} differs from its build: run `dlcourse translate build`"
        + _first_cell_differing(target, expected))


def _first_cell_differing(target, expected):
    if not target.is_file():
        return " (it does not exist)"
    built, wanted = json.loads(target.read_text(encoding="utf-8")), json.loads(expected)
    for index, (a, b) in enumerate(zip(built["cells"], wanted["cells"])):
        if a != b:
            return f" (first difference: cell {index}, id {b.get('id')})"
    return " (the number of cells or the notebook's metadata differs)"


@pytest.mark.parametrize("notebook", TRANSLATED, ids=IDS)
def test_code_cells_and_outputs_are_the_english_ones_byte_for_byte(notebook):
    """Why lessons/zh/ is left out of nbval (pyproject's --ignore): this holds it to running
    exactly what lessons/ runs."""
    english = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    chinese = json.loads(build.output_path(notebook).read_text(encoding="utf-8"))["cells"]
    assert [(c["id"], c["cell_type"]) for c in chinese] == [(c["id"], c["cell_type"])
                                                           for c in english]
    for en, zh in zip(english, chinese):
        if en["cell_type"] == "code":
            assert zh == en, f"{notebook.name}: code cell {en['id']} differs from the English"


def _links(notebook):
    nb = nbformat.read(str(notebook), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for link in re.findall(r"\]\(([^)\s]+)", cell.source):
                if not re.match(r"^[a-z]+:|^#", link):
                    yield cell.id, link.split("#")[0]


@pytest.mark.parametrize("notebook", TRANSLATED, ids=IDS)
def test_every_relative_link_resolves_from_the_zh_folder(notebook):
    built = build.output_path(notebook)
    broken = [(cid, link) for cid, link in _links(built) if not (built.parent / link).exists()]
    assert not broken, f"{built.relative_to(COURSE)}: links that go nowhere: {broken}"


def test_links_point_at_translations_where_they_exist_and_at_english_files_otherwise():
    folder = COURSE / "lessons"
    text = "[a](../exercises/00_launch.ipynb) [b](../dlcourse/launcher.py#L3) [c](https://x.org/y)"
    assert build.rewrite_links(text, folder) == (
        "[a](../../exercises/zh/00_launch.ipynb) [b](../../dlcourse/launcher.py#L3) "
        "[c](https://x.org/y)")
    untranslated = "[d](10_debugging.ipynb)"  # no catalogue: the English notebook
    assert build.rewrite_links(untranslated, folder) == "[d](../10_debugging.ipynb)"


# ---------------------------------------------------------------- the checks can fail


@pytest.fixture
def course_copy(tmp_path, monkeypatch):
    """lessons/00_launch.ipynb, its catalogue and its build, copied: edit them freely."""
    (tmp_path / "lessons" / "zh").mkdir(parents=True)
    shutil.copy(COURSE / "lessons" / "00_launch.ipynb", tmp_path / "lessons")
    shutil.copy(COURSE / "lessons" / "zh" / "00_launch.ipynb", tmp_path / "lessons" / "zh")
    (tmp_path / "i18n" / "zh" / "lessons").mkdir(parents=True)
    shutil.copy(catalog.catalogue_path(COURSE / "lessons" / "00_launch.ipynb"),
                tmp_path / "i18n" / "zh" / "lessons")
    monkeypatch.setattr(catalog, "FOLDER", tmp_path / "i18n")
    return tmp_path / "lessons" / "00_launch.ipynb"


def _edit_markdown(notebook, index, new_text):
    """Replace the text of markdown cell `index`; returns (its id, its old text)."""
    nb = nbformat.read(str(notebook), as_version=4)
    cell = [c for c in nb.cells if c.cell_type == "markdown"][index]
    old, cell.source = cell.source, new_text
    nbformat.write(nb, str(notebook))
    return cell.id, old


def test_an_english_edit_makes_its_entry_stale_and_the_check_names_lesson_and_cell(course_copy):
    cell_id, old = _edit_markdown(course_copy, 2, "Three things to read, now said differently.")
    with pytest.raises(AssertionError) as failed:  # the test above, on the edited copy
        test_every_markdown_cell_and_hint_has_a_current_translation(course_copy)
    assert str(failed.value).startswith(
        f"lessons/00_launch.ipynb: no current translation for cell {cell_id}: the entry holds "
        "older English (run `dlcourse translate update`)")
    with pytest.raises(build.TranslationMissing, match=rf"00_launch.ipynb .*\n  cell {cell_id}"):
        build.translated_notebook(course_copy)

    [(path, counts)] = build.update([course_copy])  # msgmerge's way: old text kept, fuzzy
    po = catalog.load(path)
    entry = po.find(f"cell {cell_id}", by="msgctxt")
    assert counts == {"new": 0, "fuzzy": 1, "obsolete": 0} and "fuzzy" in entry.flags
    assert entry.previous_msgid == old and entry.msgstr  # the old translation, to revise
    assert [m.why.split(":")[0] for m in build.check(course_copy, po)] == ["fuzzy"]

    entry.msgstr, entry.flags = "输出里有三点值得看，换个说法。", []  # the translator's fix
    po.save(str(path))
    test_every_markdown_cell_and_hint_has_a_current_translation(course_copy)  # passes again


def test_a_new_cell_comes_in_untranslated_and_a_deleted_one_goes_obsolete(course_copy):
    nb = nbformat.read(str(course_copy), as_version=4)
    gone = nb.cells.pop(2).id if nb.cells[2].cell_type == "markdown" else None
    nb.cells.append(nbformat.v4.new_markdown_cell("A new closing paragraph."))
    nbformat.write(nb, str(course_copy))
    [(path, counts)] = build.update([course_copy])
    assert counts["new"] == 1 and counts["obsolete"] == (1 if gone else 0)
    assert [m.why for m in build.check(course_copy, catalog.load(path))] == ["untranslated"]


def test_the_drift_check_fails_on_a_hand_edited_build(course_copy, monkeypatch, capsys):
    target = build.output_path(course_copy)
    assert not build.build([course_copy], check_only=True)[0].changed
    target.write_text(target.read_text(encoding="utf-8").replace("第 00 课", "第 0 课", 1),
                      encoding="utf-8")
    assert build.build([course_copy], check_only=True)[0].changed
    monkeypatch.chdir(course_copy.parent.parent)
    assert cli.main(["translate", "build", "--check", "lessons/00_launch.ipynb"]) == 1
    assert "OUT OF DATE" in capsys.readouterr().out


# ---------------------------------------------------------------- hints in Chinese


def test_hints_come_from_the_catalogue_in_a_chinese_notebook(monkeypatch, capsys):
    monkeypatch.setattr(hints, "_SHOWN", {})
    monkeypatch.setenv("DLCOURSE_LANG", "zh")
    hints.hint("gather_all")
    out = capsys.readouterr().out
    assert out.startswith("gather_all，提示 2/3：dist.all_gather 填充你提供的列表")
    monkeypatch.setenv("DLCOURSE_LANG", "en")
    hints.hint("gather_all", level=2)
    assert hints.HINTS["gather_all"][1] in capsys.readouterr().out


def test_every_hint_level_of_a_translated_exercise_is_translated():
    table = i18n.translated_hints()
    for notebook in TRANSLATED:
        for exercise, levels in hints_of(notebook).items():
            untranslated = [n for n in range(1, len(levels) + 1)
                            if table.get((exercise, n), (None,))[0] != levels[n - 1]]
            assert not untranslated, f"{notebook.name}: {exercise} levels {untranslated}"


def test_the_stubs_first_hint_is_shown_in_chinese_and_keeps_english_elsewhere(monkeypatch):
    stub = "Hint: " + hints.HINTS["sum_to_rank0"][0]
    monkeypatch.setenv("DLCOURSE_LANG", "zh")
    assert not_written("sum_to_rank0", stub) == (
        "sum_to_rank0 还没有写：把它的 `raise NotImplementedError` 这一行换成你的代码。"
        "提示：只有 rank 0 需要这个和：哪个集合通信只把结果交给一个 rank？")
    monkeypatch.setenv("DLCOURSE_LANG", "en")
    assert not_written("sum_to_rank0", stub).endswith(stub)


def test_the_language_follows_the_setting_then_the_notebooks_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("DLCOURSE_LANG", raising=False)
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path / "zh")
    assert i18n.language() == "zh"
    monkeypatch.chdir(tmp_path)
    assert i18n.language() == "en"
    monkeypatch.setenv("DLCOURSE_LANG", "zh_CN")
    assert i18n.language() == "zh"
    monkeypatch.setenv("DLCOURSE_LANG", "fr")
    with pytest.raises(ValueError, match="DLCOURSE_LANG='fr': set it to one of en, zh"):
        i18n.language()


def test_dlcourse_grade_runs_a_chinese_notebook_in_chinese(monkeypatch):
    from dlcourse.grading import nbrun

    monkeypatch.delenv("DLCOURSE_LANG", raising=False)
    assert nbrun.edition_of(COURSE / "exercises" / "zh" / "00_launch.ipynb") == "zh"
    assert nbrun.edition_of(COURSE / "exercises" / "00_launch.ipynb") is None
    said = "import os; print(os.environ.get('DLCOURSE_LANG'))"
    assert nbrun._run_with_limit([sys.executable, "-c", said], 30, language="zh")[1].strip() == "zh"
    monkeypatch.setenv("DLCOURSE_LANG", "en")  # the grader's own setting wins
    assert nbrun.edition_of(COURSE / "exercises" / "zh" / "00_launch.ipynb") is None


def test_a_launch_that_reaches_a_stub_gives_its_hint_in_chinese(monkeypatch):
    from dlcourse.errors import RAISED, RankOutcome

    stub = "Hint: " + hints.HINTS["gather_all"][0]
    outcome = RankOutcome(rank=1, state=RAISED, exception="NotImplementedError", message=stub)
    monkeypatch.setenv("DLCOURSE_LANG", "zh")
    assert outcome.summary == ("raised NotImplementedError: 提示：一个集合通信就能完成：每个 rank "
                               "发出自己的 x，并收到所有人的 x")
    other = RankOutcome(rank=1, state=RAISED, exception="NotImplementedError", message="Hint: x")
    assert other.summary == "raised NotImplementedError: Hint: x"  # not a known stub: unchanged
    monkeypatch.setenv("DLCOURSE_LANG", "en")
    assert outcome.summary == f"raised NotImplementedError: {stub}"
