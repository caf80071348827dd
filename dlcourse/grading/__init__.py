"""The grading engine: one solution notebook per lesson, the exercise notebook built from it, and
grader cells that nbval runs, turned into points and a gradebook. What a grader cell calls, the
checks, is the package `dlcourse.checks`; this engine never imports it.

The contract, for every exercise set (lesson NN, topic `topic`):
- `solutions/NN_topic.ipynb` is the source. The student's part of the code sits between
  `### BEGIN SOLUTION` and `### END SOLUTION` lines, with an optional `### HINT: <one line>`
  inside. `dlcourse exercises build` writes `exercises/NN_topic.ipynb` with each region replaced
  by `raise NotImplementedError("Hint: ...")` (see `build.py`); a test fails when they drift.
- A grader cell is an ordinary code cell with the metadata
  `{"dlcourse": {"grader": "<exercise id>", "points": <int>}}` (see `notebooks.py`). It calls a
  check, e.g. `check_gather_all(gather_all)`, that raises when the student's function is wrong.
- Checks live in `dlcourse/checks/<name>/`, the lesson's name in `dlcourse.lessons`,
  and build on `dlcourse/checks/core/` (see `dlcourse/checks/__init__.py`).
- `dlcourse grade PATH... [--against EXERCISE_NOTEBOOK] [--csv FILE]` runs each notebook under
  nbval (`nbrun.py`, with the `nbresults.py` pytest plugin), puts back the released grader
  cells (`--against`), and turns grader cells into points (`grade.py`), a table and a
  gradebook (`gradebook.py`).

This package imports nothing heavy itself.
"""
