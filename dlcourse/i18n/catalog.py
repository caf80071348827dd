"""One gettext catalogue per notebook: each English markdown cell is an entry (`msgctxt` the
cell's id, `msgid` its source, `msgstr` the translation), read and written with polib, so a
translator can open it in Poedit, Lokalize or any editor that knows `.po` files.

`update` brings a catalogue in step with its English notebook, as gettext's msgmerge would:
a new cell comes in untranslated, a changed cell keeps its old translation marked `fuzzy` with
the old English beside it (`#| msgid`), a deleted cell's entry goes obsolete (`#~`). Only an
entry that is translated, not fuzzy, and whose msgid is the cell's current source counts.
The exercise catalogues also carry the hint levels (`msgctxt "hint <exercise> <level>"`).
"""

from dataclasses import dataclass
from pathlib import Path

import nbformat
import polib

FOLDER = Path(__file__).parent  # dlcourse/i18n/<lang>/<lessons|exercises>/NN_topic.po
KINDS = ("lessons", "exercises")


def catalogue_path(notebook, lang="zh"):
    """Where the catalogue of `lessons/NN_topic.ipynb` (or `exercises/...`) lives."""
    notebook = Path(notebook)
    if notebook.parent.name not in KINDS:
        raise ValueError(f"{notebook}: only notebooks in lessons/ or exercises/ are translated")
    return FOLDER / lang / notebook.parent.name / f"{notebook.stem}.po"


def translated_notebooks(course, lang="zh"):
    """Every English notebook of `course` that has a catalogue in `lang`, lessons first."""
    return [Path(course) / kind / f"{po.stem}.ipynb"
            for kind in KINDS for po in sorted((FOLDER / lang / kind).glob("*.po"))]


def markdown_cells(notebook):
    """(cell id, source) of every markdown cell of an English notebook, in order."""
    nb = nbformat.read(str(notebook), as_version=4)
    return [(cell.id, cell.source) for cell in nb.cells if cell.cell_type == "markdown"]


def cell_context(cell_id):
    return f"cell {cell_id}"


def hint_context(exercise, level):
    return f"hint {exercise} {level}"


@dataclass
class Missing:
    """An English text with no current translation: where, and why."""
    context: str
    why: str  # "untranslated", "fuzzy (the English changed)", "no entry"

    def __str__(self):
        return f"{self.context}: {self.why}"


def load(path):
    return polib.pofile(str(path), wrapwidth=78)


def translation(catalogue, context, english):
    """The msgstr for `english` under `context`, or a Missing saying why there is none."""
    entry = catalogue.find(context, by="msgctxt")
    if entry is None or entry.obsolete:
        return Missing(context, "no entry (run `dlcourse translate update`)")
    if entry.msgid != english:
        return Missing(context, "the entry holds older English (run `dlcourse translate update`)")
    if "fuzzy" in entry.flags:
        return Missing(context, "fuzzy: the English changed since it was translated")
    if not entry.msgstr.strip():
        return Missing(context, "untranslated")
    return entry.msgstr


def update(catalogue, texts, lang="zh"):
    """Bring `catalogue` (a polib.POFile, or None for a new one) in step with `texts`, a list
    of (context, English). Returns the catalogue and a count of what changed."""
    if catalogue is None:
        catalogue = polib.POFile(wrapwidth=78)
        catalogue.metadata = {"Project-Id-Version": "dlcourse", "Language": lang,
                              "MIME-Version": "1.0",
                              "Content-Type": "text/plain; charset=UTF-8",
                              "Content-Transfer-Encoding": "8bit"}
    counts = {"new": 0, "fuzzy": 0, "obsolete": 0}
    old = {e.msgctxt: e for e in catalogue}
    by_text = {e.msgid: e for e in catalogue if e.msgstr and not e.obsolete}
    entries = []
    for context, english in texts:
        entry = old.pop(context, None)
        if entry is None:  # a new cell, or a cell whose id changed but not its text
            moved = by_text.get(english)
            entry = polib.POEntry(msgctxt=context, msgid=english,
                                  msgstr=moved.msgstr if moved else "")
            counts["new"] += moved is None
        elif entry.msgid != english or entry.obsolete:
            entry.previous_msgid = entry.msgid if entry.msgid != english else None
            entry.msgid, entry.obsolete = english, False
            if entry.msgstr and "fuzzy" not in entry.flags:
                entry.flags.append("fuzzy")
            counts["fuzzy"] += 1
        entries.append(entry)
    for entry in old.values():  # cells gone from the English notebook
        if not entry.obsolete:
            counts["obsolete"] += 1
        entry.obsolete = True
        entries.append(entry)
    catalogue[:] = entries
    return catalogue, counts


def notebook_texts(notebook, hints=None):
    """(context, English) of a notebook's markdown cells, then its exercises' hint levels."""
    texts = [(cell_context(cid), source) for cid, source in markdown_cells(notebook)]
    for exercise, levels in (hints or {}).items():
        texts += [(hint_context(exercise, n), text) for n, text in enumerate(levels, start=1)]
    return texts


def catalogue_path_or_none(notebook, lang="zh"):
    """The catalogue of `notebook` when it has one (so it is translated), else None."""
    try:
        path = catalogue_path(notebook, lang)
    except ValueError:
        return None
    return path if path.is_file() else None
