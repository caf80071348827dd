"""Hints in levels, for every exercise: the stub in the exercise notebook gives the first, a
nudge; `hint("ring_reduce_scatter")` in a cell shows the next one each time it runs (or
`hint(name, level=2)` a given one); the last level is a plan in words, never the code.

A test holds the first level equal to the solution notebook's `### HINT:` line, so the stub and
this table cannot drift apart. In a Chinese notebook (`dlcourse/i18n/`) the levels come from
the exercise's catalogue. Each lesson's exercises have a table, by exercise id, in this package's modules.
"""

from dlcourse import i18n
from dlcourse.checks.hints.lessons_00_03 import HINTS as _LESSONS_00_03
from dlcourse.checks.hints.lessons_04_07 import HINTS as _LESSONS_04_07
from dlcourse.checks.hints.lessons_08_10 import HINTS as _LESSONS_08_10
from dlcourse.checks.hints.lesson_11 import HINTS as _LESSON_11

HINTS = {**_LESSONS_00_03, **_LESSONS_04_07, **_LESSONS_08_10, **_LESSON_11}  # exercise id -> its levels


def hint(exercise, level=None):
    """Print the next hint for `exercise` (each call one level further), or level `level`."""
    levels = HINTS.get(exercise)
    if levels is None:
        raise KeyError(f"no hints for {exercise!r}; the exercises with hints: "
                       f"{', '.join(HINTS)}")
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
