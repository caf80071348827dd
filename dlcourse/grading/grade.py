"""Grade submitted notebooks with nbval as the engine (`dlcourse grade`).

Each notebook runs top to bottom in a fresh kernel (`nbrun.run_cells`). A grader cell that
passed earns its points; any other earns 0 with the first line of why. Given the released
exercise notebook as `reference`, the submission's grader cells are first replaced by the
reference's (matched by exercise id), so an edited check or edited points count for nothing, and
the exercises and points are the reference's.

Whatever a submission does (crash the kernel, loop forever, fail to parse, not be a notebook,
lose its grader cells) it gets a `Submission` with the reason, and the next one is graded. Each
runs in a sandbox where bubblewrap is installed (`sandbox.isolation`, `sandbox.described`), and nothing it started
outlives its grading (`nbrun.end_family`). What is not a submission's fault (a kernel that cannot
start on this machine, a checking process that cannot run) is not scored: `grade_notebook`
raises `CannotGrade` (`probe.py`), and the class waits until the machine is fixed.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

from dlcourse.grading import probe, verdicts
from dlcourse.grading.nbresults import reason_of
from dlcourse.grading.nbrun import CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S, no_cell_ran, run_cells
from dlcourse.grading.probe import CannotGrade  # noqa: F401 (what grade_notebook may raise)
from dlcourse.grading.sandbox import described
from dlcourse.grading.notebooks import METADATA_KEY, GraderMarkError, grader_cells, read

MISSING = "no grader cell for this exercise in the notebook"

# nbval's words for a cell it could not run, and what they mean to a student.
_NBVAL_REASONS = {
    "Kernel dead on test start": "not run: the kernel died in an earlier cell",
    "Previous cell timed out, expected cell to fail": "not run: an earlier cell ran out of time",
}


@dataclass
class Result:
    exercise: str
    points: int  # possible
    earned: int
    reason: str = ""  # empty when passed


@dataclass
class Submission:
    path: Path
    results: list = field(default_factory=list)  # one Result per exercise, notebook order
    notes: list = field(default_factory=list)  # what went wrong beyond the graders themselves
    readable: bool = True  # False: not a notebook at all, so nothing in it was graded
    isolation: str = ""  # the sandbox it ran in (`sandbox.described()`); "" when nothing ran

    @property
    def total(self):
        return sum(r.earned for r in self.results)

    @property
    def possible(self):
        return sum(r.points for r in self.results)


def find_notebooks(paths):
    """Notebooks named on the command line, and every notebook below a named folder, sorted."""
    found = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return found


def read_reference(path):
    """The released exercise notebook whose grader cells replace the submissions'."""
    reference = read(path)
    if not grader_cells(reference):
        raise ValueError(f"{path} (the reference) has no grader cells to grade with")
    return reference


def expected_graders(reference):
    """The reference's graders (exercise, points), or none without a reference."""
    return grader_cells(reference) if reference is not None else []


def grade_all(notebooks, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S,
              reference=None, on_graded=None):
    """Grade each notebook in turn (each runs ranks of its own), printing one line per notebook.
    `on_graded(submissions so far)`, if given, runs after each (e.g. `Gradebook.write`)."""
    submissions = []
    for i, path in enumerate(notebooks, start=1):
        start = time.monotonic()
        submissions.append(grade_notebook(path, cell_timeout, notebook_timeout, reference))
        if on_graded is not None:
            on_graded(submissions)
        print(f"[{i}/{len(notebooks)}] {path}: {submissions[-1].total} points, graded in "
              f"{time.monotonic() - start:.1f} s", flush=True)
    return submissions


def grade_notebook(path, cell_timeout=CELL_TIMEOUT_S, notebook_timeout=NOTEBOOK_TIMEOUT_S,
                   reference=None):
    """Run one notebook under nbval and score its grader cells (`reference`: see above).
    Raises CannotGrade where nothing of it ran, or no verdict came back, and a notebook of the
    grader's own fails the same way: the fault is the machine's, not the submission's."""
    submission, expected = Submission(Path(path)), expected_graders(reference)
    try:
        nb = read(path)
        if reference is not None:
            restore_graders(nb, reference)
        graders = grader_cells(nb)
    except (ValueError, GraderMarkError) as error:
        submission.notes.append(str(error))
        submission.readable = False
        return submission
    if not graders:  # nothing to score, so nothing to run
        submission.notes.append("no grader cells (a grader cell has metadata "
                                '{"dlcourse": {"grader": ..., "points": ...}}): were they deleted?')
    else:
        calls = _export_graders(nb, graders)
        decided = {}
        cells, problem = run_cells(path, cell_timeout, notebook_timeout, nb=nb, sandbox=True,
                                   after=lambda run: decided.update(_decide(run, calls, notebook_timeout)))
        folder = Path(path).resolve().parent  # the machine's fault, or the submission's?
        if no_cell_ran(cells, problem):
            probe.kernel_starts(folder, cell_timeout, notebook_timeout)
        elif "problem" in decided:
            probe.checking_process_runs(folder, notebook_timeout)
        submission.isolation = described()
        submission.notes += [problem] if problem else []
        submission.results = [_score(g, cells.get(g.code_cell), problem, g.code_cell in calls,
                                     decided) for g in graders]
        submission.notes += _failed_other_cells(cells, {g.code_cell for g in graders})
        submission.notes += _judged_in_kernel(graders, calls)
    graded = {r.exercise for r in submission.results}
    submission.results += [Result(g.exercise, g.points, 0, MISSING)
                           for g in expected if g.exercise not in graded]
    return submission


def _score(grader, cell, problem, exported, decided):
    """The grader's Result: for an exported one (`_export_graders`), its cell only pickled the
    objects, and the verdict is the fresh process's (`decided`); else the cell's own outcome."""
    if cell is None:  # nbval never reached it
        return Result(grader.exercise, grader.points, 0, problem or "not run")
    if cell["outcome"] == "passed":
        if not exported:
            return Result(grader.exercise, grader.points, grader.points)
        verdict = decided.get(grader.code_cell)
        if verdict is None:
            return Result(grader.exercise, grader.points, 0, decided.get("problem", NO_VERDICT))
        if not verdict:
            return Result(grader.exercise, grader.points, grader.points)
        return Result(grader.exercise, grader.points, 0,
                      reason_of(verdict["ename"], verdict["evalue"]))
    reason = _NBVAL_REASONS.get(cell["reason"], cell["reason"]) or cell["outcome"]
    return Result(grader.exercise, grader.points, 0, reason)


NO_VERDICT = "no verdict: the checking process ended without one"


def _export_graders(nb, graders):
    """Put an export cell (`verdicts.export_source`) in place of every grader that is a plain
    check call; return {code cell: GraderCall} of those."""
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    calls = {}
    for g in graders:
        call = verdicts.grader_call(code_cells[g.code_cell].source)
        if call is not None:
            code_cells[g.code_cell].source = verdicts.export_source(g.code_cell, call)
            calls[g.code_cell] = call
    return calls


def _decide(run, calls, seconds):
    """{code cell: verdict} from `python -m dlcourse.checks.core.verdict`, run in the submission's
    sandbox on the objects its kernel exported; {"problem": why} if none came back."""
    if not calls:
        return {}
    stdin, key = verdicts.job(calls, str(run.notebook_folder))
    returncode, output = run(verdicts.command(), seconds, stdin)
    decided = verdicts.read(key, output)
    if decided is not None:
        return decided
    why = (f"ran past its {seconds:g} s limit" if returncode is None
           else f"exited with code {returncode}")
    return {"problem": f"{NO_VERDICT} (it {why})"}


def _judged_in_kernel(graders, calls):
    kernel = [g.exercise for g in graders if g.code_cell not in calls]
    if not kernel:
        return []
    return [f"grader cells of {', '.join(kernel)} are not one `check_...(name)` call from "
            "dlcourse.checks, so their verdict came from the notebook's own kernel, where a "
            "student cell could change it"]


def restore_graders(nb, reference):
    """Give `nb` the reference's grader cells, in place: each cell marked as grading an exercise
    of the reference gets the reference's source and points. A mark the reference does not
    have, or a second cell for one exercise (a copied cell), loses its mark: it grades nothing."""
    code_cells = [c for c in reference.cells if c.cell_type == "code"]
    official = {g.exercise: code_cells[g.code_cell] for g in grader_cells(reference)}
    restored = set()
    for cell in nb.cells:
        mark = cell.get("metadata", {}).get(METADATA_KEY)
        if cell.cell_type != "code" or not isinstance(mark, dict) or "grader" not in mark:
            continue
        exercise = mark.get("grader")
        if isinstance(exercise, str) and exercise in official and exercise not in restored:
            cell.source = official[exercise].source
            cell.metadata[METADATA_KEY] = dict(official[exercise].metadata[METADATA_KEY])
            restored.add(exercise)
        else:
            del cell.metadata[METADATA_KEY]


def _failed_other_cells(cells, grader_indices):
    """The first failing cell that is not a grader: often why the graders failed (a syntax error
    leaves the function undefined, and its grader says NameError)."""
    for index in sorted(cells):
        cell = cells[index]
        if index not in grader_indices and cell["outcome"] != "passed":
            reason = _NBVAL_REASONS.get(cell["reason"], cell["reason"])
            return [f"code cell {index} failed: {reason}"]
    return []
