"""Hints in levels, for every exercise: the stub in the exercise notebook gives the first, a
nudge; `hint("ring_reduce_scatter")` in a cell shows the next one each time it runs (or
`hint(name, level=2)` a given one); the last level is a plan in words, never the code.

Each exercise set keeps its own table, `dlcourse/checks/<set>/hints.py` (HINTS, by exercise
id); `hint` finds an exercise in the set that holds it, the sets this kernel has imported
first. A test holds the first level equal to the solution notebook's `### HINT:` line, so the
stub and the table cannot drift apart. In a Chinese notebook (`dlcourse/i18n/`) the levels come
from the exercise's catalogue.
"""

import importlib
import sys

from dlcourse import i18n
from dlcourse.lessons import LESSONS


def of_set(name):
    """{exercise id: its levels} of the exercise set `name` (a lesson's name: "zero")."""
    return importlib.import_module(f"dlcourse.checks.{name}.hints").HINTS


def __getattr__(attribute):
    """HINTS: every set's table joined, read when first asked for (it imports every set)."""
    if attribute == "HINTS":
        return {exercise: levels for entry in LESSONS
                for exercise, levels in of_set(entry.name).items()}
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def levels_of(exercise):
    """The levels of `exercise`, from the set that holds it; the sets already imported (the
    notebook's own) are read first, so a hint does not import the whole course."""
    names = sorted((entry.name for entry in LESSONS),
                   key=lambda name: f"dlcourse.checks.{name}" not in sys.modules)
    for name in names:
        if exercise in of_set(name):
            return of_set(name)[exercise]
    known = [exercise for name in names for exercise in of_set(name)]
    raise KeyError(f"no hints for {exercise!r}; the exercises with hints: {', '.join(known)}")


def hint(exercise, level=None):
    """Print the next hint for `exercise` (each call one level further), or level `level`."""
    levels = levels_of(exercise)
    shown = _SHOWN.get(exercise, 1)  # the stub showed level 1
    level = min(level or shown + 1, len(levels))
    _SHOWN[exercise] = max(shown, level)
    text = i18n.hint_text(exercise, level, levels[level - 1])
    if i18n.language() == "zh":  # the same line in Chinese, from the exercise's catalogue
        more = "" if level == len(levels) else f"（再运行 hint({exercise!r}) 看下一条）"
        print(f"{exercise}，提示 {level}/{len(levels)}：{text}{more}")
        return
    more = "" if level == len(levels) else f" (run hint({exercise!r}) again for more)"
    print(f"{exercise}, hint {level} of {len(levels)}: {text}{more}")


_SHOWN = {}  # exercise -> the highest level shown in this kernel
