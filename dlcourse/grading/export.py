"""What a submission's kernel runs in place of a grader cell when `dlcourse grade` grades it: the
objects the grader call names, pickled by value into files, and nothing checked (issue 16).

The check itself then runs in a fresh process (`dlcourse/checks/core/verdict.py`) that no student
cell ran in: a cell that replaced the check, an exception hook or an input transformer changes
nothing there. Whatever this kernel writes is only ever unpickled on the check's ranks, as the
student's own code.
"""

import os

from dlcourse import pickling

FOLDER = ".dlcourse-exports"  # beside the notebook's copy, in the sandbox's writable folder
MAX_BYTES = 64 * 2**20  # per object: a function and what it refers to, not a dataset


def path(cell, position):
    """The file of the `position`-th object named by the grader of code cell `cell`."""
    return os.path.join(FOLDER, f"cell{cell}.arg{position}.pkl")


def export(cell, objects):
    """Pickle each of `objects` (the grader call's arguments) into `path(cell, i)`."""
    os.makedirs(FOLDER, exist_ok=True)
    for position, obj in enumerate(objects):
        payload = pickling.dumps(obj)
        if len(payload) > MAX_BYTES:
            raise ValueError(f"argument {position} of the grader pickles to {len(payload):,} "
                             f"bytes, over {MAX_BYTES:,}: a function should not hold data")
        with open(path(cell, position), "wb") as f:
            f.write(payload)


def cell_source(cell, names):
    """The source the kernel runs in place of the grader in code cell `cell`."""
    return (f"__import__('dlcourse.grading.export', fromlist=['export']).export("
            f"{cell}, [{', '.join(names)}])")
