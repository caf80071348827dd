"""Build `lessons/zh/NN_topic.ipynb` and `exercises/zh/NN_topic.ipynb` from the English
notebook and its catalogue (`dlcourse translate build`), and bring the catalogues in step with
the English (`dlcourse translate update`); the catalogues themselves are `dlcourse/i18n/`'s.

Markdown cells are the catalogue's translations; code cells, their saved outputs and every
cell id are copied from the English notebook at build time, so an English edit to code is
absorbed by a rebuild. Relative links are rewritten for the folder one level down: a link to
a notebook that has a translation points at the translation, any other at the English file
(`../dlcourse/x.py` becomes `../../dlcourse/x.py`).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from dlcourse.i18n import catalog


def hints_of(notebook):
    """{exercise: English hint levels} for the exercises graded in `notebook` (none for a
    lesson). The one place the library reads the checks' hint tables: this build is a
    translator's tool, run apart from any graded process (tests/test_exercises.py exempts it)."""
    from dlcourse.checks.hints import of_set
    from dlcourse.grading.notebooks import grader_cells
    from dlcourse.lessons import lesson

    if Path(notebook).parent.name != "exercises":
        return {}
    hints = of_set(lesson(Path(notebook).name[:2]).name)  # the notebook's set's table
    nb = nbformat.read(str(notebook), as_version=4)
    return {g.exercise: hints[g.exercise] for g in grader_cells(nb) if g.exercise in hints}

# [text](target) or [text](target "title"); images too. Absolute URLs and anchors stay.
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")


class TranslationMissing(ValueError):
    """A markdown cell (or hint) has no current translation; the message names each one."""


def output_path(notebook, lang="zh"):
    notebook = Path(notebook)
    return notebook.parent / lang / notebook.name


def rewrite_links(text, english_folder, lang="zh"):
    """`text`'s relative links, made right for `english_folder/<lang>/`."""
    target_folder = english_folder / lang

    def fix(match):
        link = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", link, re.I):
            return match.group(0)
        path, _, anchor = link.partition("#")
        resolved = Path(os.path.normpath(english_folder / path))
        translated = output_path(resolved, lang)
        if resolved.suffix == ".ipynb" and catalog.catalogue_path_or_none(resolved, lang):
            resolved = translated
        new = Path(os.path.relpath(resolved, target_folder)).as_posix()
        if path.endswith("/") and not new.endswith("/"):
            new += "/"
        return match.group(1) + new + ("#" + anchor if anchor else "") + match.group(3)

    return LINK.sub(fix, text)


def translated_notebook(notebook, lang="zh"):
    """The text of the translated notebook; raises TranslationMissing naming every cell (and
    hint) without a current translation."""
    notebook = Path(notebook)
    po = catalog.load(catalog.catalogue_path(notebook, lang))
    nb = nbformat.read(str(notebook), as_version=4)
    missing = [m for m in check(notebook, po) if m]
    if missing:
        raise TranslationMissing(
            f"{notebook} has no current {lang} translation for:\n  "
            + "\n  ".join(map(str, missing))
            + f"\ntranslate them in {catalog.catalogue_path(notebook, lang)} "
            "(after `dlcourse translate update`)")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = catalog.translation(po, catalog.cell_context(cell.id), cell.source)
            cell.source = rewrite_links(text, notebook.parent.resolve(), lang)
    nb.metadata["dlcourse"] = {"lang": lang, "translated_from": f"../{notebook.name}"}
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def check(notebook, po, lang="zh"):
    """Missing for every markdown cell and hint level of `notebook` not translated in `po`."""
    texts = catalog.notebook_texts(notebook, hints_of(notebook))
    found = (catalog.translation(po, context, english) for context, english in texts)
    return [f for f in found if isinstance(f, catalog.Missing)]


@dataclass
class Built:
    english: Path
    translated: Path
    changed: bool


def build(notebooks, lang="zh", check_only=False):
    """Write (with `check_only`, only compare) the translation of every notebook."""
    results = []
    for notebook in notebooks:
        target = output_path(notebook, lang)
        text = translated_notebook(notebook, lang).encode("utf-8")
        changed = not target.is_file() or target.read_bytes() != text
        if changed and not check_only:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text)
        results.append(Built(Path(notebook), target, changed))
    return results


def update(notebooks, lang="zh"):
    """Create or bring in step the catalogue of every notebook; returns (path, counts)."""
    results = []
    for notebook in notebooks:
        path = catalog.catalogue_path(notebook, lang)
        po = catalog.load(path) if path.is_file() else None
        po, counts = catalog.update(po, catalog.notebook_texts(notebook, hints_of(notebook)), lang)
        path.parent.mkdir(parents=True, exist_ok=True)
        po.save(str(path))
        results.append((path, counts))
    return results
