"""The Chinese edition (lessons and exercises 00-07 so far): catalogues and language.

- `catalog.py`: one gettext `.po` catalogue per notebook, `zh/lessons/NN_topic.po` and
  `zh/exercises/NN_topic.po`, keyed by the English markdown cells and hint levels.
- `dlcourse/translate.py` (the translator's tool, outside this package because it reads the
  checks' hint tables, and graded kernels import this package): `dlcourse translate build`
  writes `lessons/zh/` and `exercises/zh/`.
- `zh/glossary.md`: one Chinese term per English one, and the alternatives not to write.

After an English edit: `dlcourse translate update` (new cells come in untranslated, changed ones
fuzzy with the old English beside them), translate those entries in the `.po` (Poedit, or any
editor: fill `msgstr`, drop the `fuzzy` flag), then `dlcourse translate build`;
`tests/test_i18n.py` names every lesson and cell still missing. A new notebook (as lesson 07 was):
`dlcourse translate update lessons/07_combining.ipynb exercises/07_combining.ipynb` creates its
catalogues; once they are translated, `dlcourse translate build` builds it and relinks the others.

The language of hints and "not written yet" messages: `DLCOURSE_LANG` (`zh` or `en`) when set,
otherwise `zh` when the kernel runs in a `zh/` folder (Jupyter and nbval start a notebook's
kernel in the notebook's folder), otherwise English.
"""

import functools
import os
from pathlib import Path

LANGS = ("en", "zh")


def language():
    """`en` or `zh`, as the module docstring says."""
    chosen = os.environ.get("DLCOURSE_LANG", "").strip().lower().split("_")[0].split("-")[0]
    if chosen:
        if chosen not in LANGS:
            raise ValueError(f"DLCOURSE_LANG={os.environ['DLCOURSE_LANG']!r}: set it to one of "
                             f"{', '.join(LANGS)} (or unset it)")
        return chosen
    return "zh" if Path.cwd().name == "zh" else "en"


@functools.lru_cache(maxsize=None)
def translated_hints(lang="zh"):
    """{(exercise, level): (English, translation)} from every exercise catalogue of `lang`: the
    entries that are translated and not fuzzy. The English is kept beside each so that a caller
    holding today's English can tell a stale entry (an English edit falls back to English); the
    hint tables themselves stay in `dlcourse.checks.hints`, which the library never imports."""
    from dlcourse.i18n import catalog

    table = {}
    for po_path in sorted((catalog.FOLDER / lang / "exercises").glob("*.po")):
        for entry in catalog.load(po_path):
            parts = (entry.msgctxt or "").split()
            if len(parts) != 3 or parts[0] != "hint" or entry.obsolete:
                continue
            if entry.msgstr.strip() and "fuzzy" not in entry.flags:
                table[parts[1], int(parts[2])] = (entry.msgid, entry.msgstr)
    return table


def hint_text(exercise, level, english):
    """The hint in the current language, or `english` when it has no current translation."""
    if language() != "zh":
        return english
    source, chinese = translated_hints("zh").get((exercise, level), (None, None))
    return chinese if source == english else english


def stub_message(message):
    """A stub's "Hint: <level 1 of an exercise>" in the current language: in Chinese
    "提示：<its translation>" when that first level has a current translation; anything else
    unchanged."""
    if language() != "zh" or not message.startswith("Hint:"):
        return message
    english = message[len("Hint:"):].strip()
    chinese = next((zh for (_, level), (source, zh) in translated_hints("zh").items()
                    if level == 1 and source == english), None)
    return f"提示：{chinese}" if chinese else message
