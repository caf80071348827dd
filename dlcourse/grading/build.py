"""Build a student's exercise notebook from its solution notebook (`dlcourse exercises build`).

`solutions/NN_topic.ipynb` is the only source. In its code cells, the student's part is a region:

    def gather_all(x):
        ### BEGIN SOLUTION
        ### HINT: one dist.all_gather into a list of world_size tensors shaped like x
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        ...
        ### END SOLUTION

which `exercises/NN_topic.ipynb` gets as a stub at the indentation of the BEGIN line:

    def gather_all(x):
        # YOUR CODE HERE
        raise NotImplementedError("Hint: one dist.all_gather into a list of world_size tensors ...")

Rules for authors:
- The markers are whole lines: `### BEGIN SOLUTION`, `### END SOLUTION`, and at most one
  `### HINT: <one line>` inside a region (it is a comment, so the solution still runs). Without a
  hint the stub says "Hint: write this part of the exercise".
- A cell may hold several regions; regions do not nest; a grader cell holds none.
- Every code cell loses its outputs, execution count and recorded run timings
  (`metadata.execution`); everything else (markdown, metadata, cell ids, grader cells) is copied
  unchanged, so the same solution always gives the same bytes.
"""

from dataclasses import dataclass
from pathlib import Path

import nbformat

from dlcourse.grading.notebooks import grader_cells

BEGIN, END, HINT = "### BEGIN SOLUTION", "### END SOLUTION", "### HINT:"
DEFAULT_HINT = "write this part of the exercise"


class BuildError(ValueError):
    """The solution notebook breaks a rule above; the message names the cell and line."""


def stub_source(source, where="cell"):
    """The cell source with every solution region replaced by its stub."""
    out, region = [], None  # region: (indent, hint) while inside BEGIN ... END
    for number, line in enumerate(source.split("\n"), start=1):
        marker, indent = line.strip(), line[: len(line) - len(line.lstrip())]
        at = f"{where}, line {number}"
        if marker == BEGIN:
            if region is not None:
                raise BuildError(f"{at}: {BEGIN} inside another region (regions do not nest)")
            region = [indent, None]
        elif marker == END:
            if region is None:
                raise BuildError(f"{at}: {END} without a {BEGIN} before it")
            out += _stub(*region)
            region = None
        elif marker.startswith(HINT):
            if region is None or region[1] is not None:
                raise BuildError(f"{at}: {HINT} must be inside a region, at most one per region")
            region[1] = marker[len(HINT):].strip()
        elif region is None:
            out.append(line)
    if region is not None:
        raise BuildError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def _stub(indent, hint):
    text = f"Hint: {hint or DEFAULT_HINT}"
    # A double-quoted literal as the course writes them; repr() escapes anything unusual.
    literal = f'"{text}"' if '"' not in text and "\\" not in text else repr(text)
    return [f"{indent}# YOUR CODE HERE", f"{indent}raise NotImplementedError({literal})"]


def exercise_notebook(solution_path):
    """Read a solution notebook and return the exercise notebook's text."""
    nb = nbformat.read(str(solution_path), as_version=4)
    # Raises on malformed grader metadata, before any student sees it.
    graders = {g.code_cell for g in grader_cells(nb)}
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    regions = 0
    for index, cell in enumerate(code_cells):
        stubbed = stub_source(cell.source, where=f"{solution_path}: code cell {index}")
        if stubbed != cell.source:
            if index in graders:
                raise BuildError(f"{solution_path}: code cell {index} is a grader cell; it cannot "
                                 "hold a solution region")
            regions += 1
        cell.source, cell.outputs, cell.execution_count = stubbed, [], None
        cell.metadata.pop("execution", None)  # run timings some front ends record: outputs too
    if regions == 0:
        raise BuildError(f"{solution_path}: no {BEGIN} region, so the exercise notebook would "
                         "hand out the solution. Mark the student's part of the code.")
    text = nbformat.writes(nb)  # keys sorted, one-space indent: stable bytes for the same input
    return text if text.endswith("\n") else text + "\n"


@dataclass
class Built:
    solution: Path
    exercise: Path
    changed: bool  # the exercise file did not already hold exactly these bytes


def build(solutions, out_dir=None, check=False):
    """Write (or with `check`, only compare) the exercise notebook of every solution notebook,
    into `out_dir`, by default the `exercises/` folder beside the solution's folder."""
    results = []
    for solution in sorted(Path(p) for p in solutions):
        folder = Path(out_dir) if out_dir else solution.parent.parent / "exercises"
        target = folder / solution.name
        text = exercise_notebook(solution).encode("utf-8")
        changed = not target.is_file() or target.read_bytes() != text
        if changed and not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text)
        results.append(Built(solution, target, changed))
    return results
