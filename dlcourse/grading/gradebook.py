"""What `dlcourse grade` shows and writes: a table per notebook and a CSV gradebook.

The gradebook has one row per submission and one column per exercise (the points earned), then
`total`, `possible` and `notes` (why points were lost). Exercises are the union of the grader
cells of every notebook graded in one call, in the order first seen, so grade one exercise set
per call; a submission without an exercise's grader cell gets 0 for it, and a note.
"""

import csv

from dlcourse.grading.grade import Result

REASON_WIDTH = 100  # characters of a failure shown in the table; the CSV keeps the whole line


def align(submissions):
    """Give every submission a Result for every exercise seen; return the exercise ids."""
    exercises, points = [], {}
    for sub in submissions:
        for r in sub.results:
            if r.exercise not in points:
                exercises.append(r.exercise)
                points[r.exercise] = r.points
    for sub in submissions:
        have = {r.exercise for r in sub.results}
        reason = ("no grader cell for this exercise in the notebook" if sub.readable
                  else "not graded: see the note")
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
        reason = r.reason if len(r.reason) <= REASON_WIDTH else r.reason[:REASON_WIDTH - 3] + "..."
        lines.append(f"  {r.exercise.ljust(width)}  {r.earned:>2} / {r.points:<2} {result}  {reason}"
                     .rstrip())
    lines += [f"  note: {note}" for note in sub.notes]
    return lines


def summary(submissions):
    full = sum(1 for s in submissions if s.results and s.total == s.possible)
    return f"{len(submissions)} notebook(s) graded, {full} with full points"


def write_csv(submissions, exercises, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", *exercises, "total", "possible", "notes"])
        for sub in submissions:
            earned = {r.exercise: r.earned for r in sub.results}
            lost = [f"{r.exercise}: {r.reason}" for r in sub.results if r.reason]
            writer.writerow([str(sub.path), *(earned[e] for e in exercises), sub.total,
                             sub.possible, " | ".join(sub.notes + lost)])
