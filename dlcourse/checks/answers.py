"""Where the answer-blocking engine was first imported from; it lives in the core now
(`dlcourse/checks/core/answers.py`): `from dlcourse.checks.core import Answers`."""

from dlcourse.checks.core.answers import (WHY, WHY_KEY, Answers, library_answers,  # noqa: F401
                                          package_modules, refusing_answers)
