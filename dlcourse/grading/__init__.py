"""Graded exercises: one solution notebook per lesson, the exercise notebook built from it, and
grader cells that nbval runs (COURSE.md, "Exercises and grading").

The contract, for every exercise set (lesson NN, topic `topic`):
- `solutions/NN_topic.ipynb` is the source. The student's part of the code sits between
  `### BEGIN SOLUTION` and `### END SOLUTION` lines, with an optional `### HINT: <one line>`
  inside. `dlcourse exercises build` writes `exercises/NN_topic.ipynb` with each region replaced
  by `raise NotImplementedError("Hint: ...")` (see `build.py`); a test fails when they drift.
- A grader cell is an ordinary code cell with the metadata
  `{"dlcourse": {"grader": "<exercise id>", "points": <int>}}` (see `notebooks.py`). It calls a
  check, e.g. `check_gather_all(gather_all)`, that raises when the student's function is wrong.
- Checks live in `dlcourse/grading/<topic>.py` and build on `core.py` (run on real ranks,
  compare with an independent reference, forbid collectives, messages a student can act on).
  Lesson 00's are in `launch.py`, lesson 01's in `memory.py`, lesson 02's in `collectives.py`
  (with `rings.py`), lesson 03's in `data_parallel.py` (with `buckets.py` and `replicas.py`).
- `dlcourse grade PATH... [--against EXERCISE_NOTEBOOK] [--csv FILE]` runs each notebook under
  nbval (`nbrun.py`, with the `nbresults.py` pytest plugin), puts back the released grader
  cells (`--against`), and turns grader cells into points (`grade.py`), a table and a
  gradebook (`gradebook.py`).

This package imports nothing heavy itself: `from dlcourse.grading.launch import check_gather_all`.
"""
