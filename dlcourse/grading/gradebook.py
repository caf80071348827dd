"""What `dlcourse grade` shows and writes: a table per notebook and a CSV gradebook.

The gradebook has one row per submission and one column per exercise (the points earned), then
`total`, `possible`, `notes` (why points were lost: each failure's first line and the check's
hint, trimmed at a word) and `isolation` (the sandbox it ran in: "bubblewrap", "bubblewrap, ranks
sharing /tmp" where its ranks could not have one each, or "none" where bubblewrap is not
installed; empty when nothing ran). The exercises are the reference's (with
`--against`), then any other grader cells of the notebooks graded in one call, in the order first
seen: grade one exercise set per call. A submission without an exercise's grader cell
gets 0 for it, and a note.
"""

import csv
import os

from dlcourse.grading.grade import MISSING, Result
from dlcourse.grading.text import trim

REASON_WIDTH = 100  # characters of a failure shown in the table; the CSV keeps the line and hint


def align(submissions, expected=()):
    """Give every submission a Result for every exercise; return the exercise ids. `expected`:
    the reference's graders (`notebooks.Grader`), which come first and set the points."""
    points = {g.exercise: g.points for g in expected}
    for sub in submissions:
        for r in sub.results:
            points.setdefault(r.exercise, r.points)
    exercises = list(points)  # dicts keep insertion order: the reference's, then first seen
    for sub in submissions:
        have = {r.exercise for r in sub.results}
        reason = MISSING if sub.readable else "not graded: see the note"
        for exercise in exercises:
            if exercise not in have:
                sub.results.append(Result(exercise, points[exercise], 0, reason))
        order = {e: i for i, e in enumerate(exercises)}
        sub.results.sort(key=lambda r: order[r.exercise])
    return exercises


def table(sub):
    """The lines printed for one submission."""
    lines = [f"{sub.path}: {sub.total} / {sub.possible} points"]
    width = max([len("exercise")] + [len(r.exercise) for r in sub.results])
    if sub.results:
        lines.append(f"  {'exercise'.ljust(width)}  points  result  first line of the failure")
    for r in sub.results:
        result = "passed" if not r.reason else "failed"
        reason = trim(r.reason, REASON_WIDTH)
        row = f"  {r.exercise.ljust(width)}  {r.earned:>2} / {r.points:<2} {result}  {reason}"
        lines.append(row.rstrip())
    lines += [f"  note: {note}" for note in sub.notes]
    return lines


def summary(submissions):
    full = sum(1 for s in submissions if s.results and s.total == s.possible)
    return f"{len(submissions)} notebook(s) graded, {full} with full points"


def write_csv(submissions, exercises, path, kept=()):
    """Write the gradebook: `kept` rows (dicts, from an earlier run) first, then `submissions`.
    Written to a temporary file, flushed to disk and renamed over `path`: a run killed at any
    moment leaves the previous gradebook or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        header = ["submission", *exercises, "total", "possible", "notes", "isolation"]
        writer.writerow(header)
        for row in kept:
            writer.writerow([row.get(column, "") for column in header])
        for sub in submissions:
            earned = {r.exercise: r.earned for r in sub.results}
            lost = [f"{r.exercise}: {r.reason}" for r in sub.results if r.reason]
            writer.writerow([str(sub.path), *(earned[e] for e in exercises), sub.total,
                             sub.possible, " | ".join(sub.notes + lost), sub.isolation])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Gradebook:
    """The CSV gradebook, written again after every submission: an interrupted run keeps each
    row it finished, and a rerun with the same file grades only the notebooks not in it yet."""

    def __init__(self, path, expected=()):
        self.path, self.expected = path, expected
        self.exercises, self.kept = _read(path)

    def has(self, notebook):
        return any(row["submission"] == str(notebook) for row in self.kept)

    def write(self, submissions):
        """Write the kept rows and `submissions` (aligned to every exercise) to the file."""
        exercises = align(submissions, self.expected)
        columns = self.exercises + [e for e in exercises if e not in self.exercises]
        for sub in submissions:  # an exercise only earlier rows have: 0 for the new ones
            have = {r.exercise for r in sub.results}
            sub.results += [Result(e, 0, 0, MISSING) for e in columns if e not in have]
        write_csv(submissions, columns, self.path, self.kept)


def _read(path):
    """(exercise columns, rows) of an existing gradebook, or ([], []) if there is none."""
    if not os.path.exists(path):
        return [], []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        columns = reader.fieldnames or []
    named = ("submission", "total", "possible", "notes", "isolation")
    return [c for c in columns if c not in named], rows
