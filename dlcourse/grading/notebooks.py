"""Reading the grading marks out of a notebook: which code cells are graders, for how many points.

A grader cell is an ordinary code cell whose metadata holds

    {"dlcourse": {"grader": "<exercise id>", "points": <int>}}

The exercise id names one exercise of the notebook (one grader cell each); it becomes a column of
the gradebook. Both `dlcourse exercises build` and `dlcourse grade` read the marks through
`grader_cells`, so an author's typo is caught at build time, before any student sees it.
"""

from dataclasses import dataclass

METADATA_KEY = "dlcourse"  # cell.metadata[METADATA_KEY] = {"grader": ..., "points": ...}


class GraderMarkError(ValueError):
    """A grader cell's metadata is malformed, or two cells grade the same exercise."""


@dataclass(frozen=True)
class Grader:
    exercise: str  # the exercise id, e.g. "gather_all"
    points: int  # what passing the cell is worth
    code_cell: int  # index among the notebook's code cells: nbval's "Cell N"


def read(path):
    """The notebook at `path` as nbformat v4; raises ValueError saying why it cannot be read."""
    import nbformat  # here: its schema validator takes seconds to import, and a kernel that
    # only runs `check_all` (which reads the course's own notebook as JSON) never needs it

    try:
        return nbformat.read(str(path), as_version=4)
    except Exception as error:  # nbformat raises several types for bad JSON or bad structure
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"not a readable notebook ({type(error).__name__}: {first})") from None


def grader_cells(nb):
    """Every grader in notebook order (`nb` as nbformat reads it, or as plain JSON). Raises
    GraderMarkError naming the cell that is wrong."""
    graders, seen = [], {}
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for index, cell in enumerate(code_cells):
        mark = cell.get("metadata", {}).get(METADATA_KEY, {})
        if not isinstance(mark, dict) or "grader" not in mark:
            continue
        grader = _parse_mark(mark, index)
        if grader.exercise in seen:
            raise GraderMarkError(
                f"code cells {seen[grader.exercise]} and {index} both grade {grader.exercise!r}: "
                "give each exercise exactly one grader cell"
            )
        seen[grader.exercise] = index
        graders.append(grader)
    return graders


def _parse_mark(mark, index):
    exercise, points = mark.get("grader"), mark.get("points")
    if not isinstance(exercise, str) or not exercise.strip():
        raise GraderMarkError(f"code cell {index}: metadata {METADATA_KEY}.grader must be the "
                              f"exercise id as a non-empty string, got {exercise!r}")
    # bool is an int in Python; `"points": true` is a typo, not one point.
    if isinstance(points, bool) or not isinstance(points, int) or points < 0:
        raise GraderMarkError(f"code cell {index} ({exercise}): metadata {METADATA_KEY}.points "
                              f"must be a whole number >= 0, got {points!r}")
    return Grader(exercise.strip(), points, index)
