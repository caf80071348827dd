"""The instructor's commands: `dlcourse exercises build` (the student notebooks from the solutions),
`dlcourse translate` (the Chinese edition) and `dlcourse grade` (a class into a gradebook).

`dlcourse.cli` adds them beside the student's commands; each is a small function that takes the
parsed arguments, and each `add_*` adds one subcommand.
"""

import sys

def exercises(args):
    """Build exercises/NN_topic.ipynb from solutions/NN_topic.ipynb (or check they agree)."""
    from pathlib import Path

    from dlcourse.grading import build

    solutions = args.solutions or sorted(Path("solutions").glob("*.ipynb"))
    if not solutions:
        print("dlcourse exercises build: no solutions/*.ipynb here; run it from the course "
              "folder or name the solution notebooks", file=sys.stderr)
        return 2
    try:
        built = build.build(solutions, args.out, check=args.check)
    except (OSError, ValueError) as error:
        print(f"dlcourse exercises build: {error}", file=sys.stderr)
        return 2
    return _report([(b.exercise, b.solution, b.changed) for b in built], args.check,
                   "dlcourse exercises build")


def translate(args):
    """Update the catalogues from the English notebooks, or build lessons/zh/ and exercises/zh/
    from them (`--check`: write nothing, exit 1 when a built notebook differs)."""
    import os
    from pathlib import Path

    from dlcourse import translate as build
    from dlcourse.i18n import catalog

    name = f"dlcourse translate {args.action}"
    notebooks = [Path(p) for p in args.notebooks] or catalog.translated_notebooks(".", args.lang)
    if not notebooks:
        print(f"{name}: no catalogue in dlcourse/i18n/{args.lang}/; name the English notebooks "
              "to translate (e.g. lessons/07_combining.ipynb)", file=sys.stderr)
        return 2
    try:
        if args.action == "update":
            for path, counts in build.update(notebooks, args.lang):
                path = os.path.relpath(path)  # as the user would type it
                print(f"{path}: {counts['new']} new, {counts['fuzzy']} fuzzy, "
                      f"{counts['obsolete']} obsolete")
            return 0
        built = build.build(notebooks, args.lang, check_only=args.check)
    except (OSError, ValueError) as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 2 if not isinstance(error, build.TranslationMissing) else 1
    return _report([(b.translated, b.english, b.changed) for b in built], args.check,
                   "dlcourse translate build")


def _report(built, check, command):
    """Print each (written, from, changed) of a build, or with --check what is out of date;
    returns the exit code: 1 when --check found one, else 0."""
    for written, source, changed in built:
        state = ("OUT OF DATE" if check else "written") if changed else "up to date"
        print(f"{written}: {state} (from {source})")
    if check and any(changed for _, _, changed in built):
        print(f"run `{command}` to rebuild them", file=sys.stderr)
        return 1
    return 0


def grade(args):
    """Grade notebooks (or folders of them) with nbval: a table each, optionally a CSV. Exit 0:
    full points everywhere; 1: points lost; 2: bad arguments; 3: stopped, as this machine cannot
    run a notebook (a kernel or the checking process cannot start): no student is given 0."""
    from dlcourse.grading import grade as grading, gradebook

    if not (args.cell_timeout > 0 and args.notebook_timeout > 0):
        print("dlcourse grade: --cell-timeout and --notebook-timeout are seconds, > 0",
              file=sys.stderr)
        return 2
    try:
        notebooks = grading.find_notebooks(args.paths)
        reference = grading.read_reference(args.against) if args.against else None
    except (FileNotFoundError, ValueError) as error:
        print(f"dlcourse grade: {error}", file=sys.stderr)
        return 2
    if not notebooks:
        print("dlcourse grade: no .ipynb notebooks in " + " ".join(args.paths), file=sys.stderr)
        return 2
    book = gradebook.Gradebook(args.csv, grading.expected_graders(reference)) if args.csv else None
    if book and any(book.has(nb) for nb in notebooks):
        notebooks = [nb for nb in notebooks if not book.has(nb)]
        print(f"resuming {args.csv}: its {len(book.kept)} row(s) are kept, "
              f"{len(notebooks)} notebook(s) left to grade (delete it to grade all again)")
    try:
        submissions = grading.grade_all(notebooks, args.cell_timeout, args.notebook_timeout,
                                        reference, on_graded=book.write if book else None)
    except grading.CannotGrade as error:  # the machine's fault: no 0 is written for anyone
        kept = f"; the gradebook {args.csv} keeps the rows graded before" if book else ""
        print(f"dlcourse grade: STOPPED, nothing more graded: {error}{kept}", file=sys.stderr)
        return 3
    gradebook.align(submissions, grading.expected_graders(reference))
    for submission in submissions:  # after align: every table lists every exercise
        print("\n" + "\n".join(gradebook.table(submission)))
    if book:
        book.write(submissions)
        print(f"\ngradebook written to {args.csv}")
    print(gradebook.summary(submissions))
    return 0 if all(s.results and s.total == s.possible for s in submissions) else 1


def add_exercises(sub):
    p = sub.add_parser("exercises", help="build the exercise notebooks from the solutions")
    actions = p.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help=exercises.__doc__)
    b.add_argument("solutions", nargs="*", help="solution notebooks (default: solutions/*.ipynb)")
    b.add_argument("--out", help="folder to write into (default: exercises/ beside solutions/)")
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if an exercise notebook differs from its build")
    b.set_defaults(run=exercises)


def add_translate(sub):
    p = sub.add_parser("translate", help="the Chinese edition: update catalogues, build notebooks")
    actions = p.add_subparsers(dest="action", required=True)
    for action, text in [("update", "bring each notebook's .po catalogue in step with the "
                          "English (new cells untranslated, changed ones fuzzy)"),
                         ("build", "write lessons/zh/ and exercises/zh/ from the English "
                          "notebooks and their catalogues")]:
        a = actions.add_parser(action, help=text)
        a.add_argument("notebooks", nargs="*",
                       help="English notebooks (default: every one with a catalogue)")
        a.add_argument("--lang", default="zh", choices=["zh"], help="the edition (zh)")
        if action == "build":
            a.add_argument("--check", action="store_true",
                           help="write nothing; exit 1 if a built notebook differs")
        a.set_defaults(run=translate, check=False)


def add_grade(sub):
    from dlcourse.grading.nbrun import CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S

    p = sub.add_parser("grade", help=grade.__doc__)
    p.add_argument("paths", nargs="+", help="notebooks, or folders searched for *.ipynb")
    p.add_argument("--csv", help="write the gradebook (one row per notebook) to this file, "
                                 "after each notebook; a rerun with it grades only the rest")
    p.add_argument("--against", metavar="NOTEBOOK",
                   help="the released exercise notebook: its grader cells (code and points) "
                        "replace each submission's, so an edited check cannot pass")
    p.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S,
                   help=f"seconds one cell may run (default {CELL_TIMEOUT_S:g})")
    p.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT_S,
                   help=f"seconds a whole notebook may run (default {NOTEBOOK_TIMEOUT_S:g})")
    p.set_defaults(run=grade)
