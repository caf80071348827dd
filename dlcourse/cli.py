"""The `dlcourse` command: `info`, `lessons`, `tour`, `plan`, and the instructor's tools.

Each subcommand is a small function that takes the parsed arguments; `COMMANDS` lists them.
"""

import argparse
import sys


def info(args):
    """What this machine offers the course: torch, backends, GPUs, cores, what auto picks."""
    from dlcourse import backends

    rows = backends.describe()
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    return 0


def tour(args):
    """Train the course GPT with every strategy on real ranks; print one table."""
    from dlcourse import tour as tour_module

    if args.world_size < 1 or args.steps < 1:
        print("dlcourse tour: --world-size and --steps must be >= 1", file=sys.stderr)
        return 2
    try:
        table = tour_module.run(world_size=args.world_size, steps=args.steps, backend=args.backend)
    except ValueError as error:
        print(f"dlcourse tour: {error}", file=sys.stderr)
        return 2
    failed = [row["strategy"] for row in table if not row["matches"]]
    # a row may carry its own tolerance (tour/__init__.py says why); name those that ran
    own = {row.name: row.tolerance for row in tour_module.ROWS
           if row.tolerance != tour_module.MATCH_TOLERANCE}
    own = [f"{row['strategy']} within {own[row['strategy']]:g}"
           for row in table if row["strategy"] in own]
    also = f"; {', '.join(own)}" if own else ""
    if failed:
        print(f"\nNOT equal to the reference (tolerance {tour_module.MATCH_TOLERANCE:g}{also}): "
              + ", ".join(failed))
        return 1
    print(f"\nEvery strategy matches the single-process reference within "
          f"{tour_module.MATCH_TOLERANCE:g} (rounding in a different summation order){also}.")
    return 0


def lessons(args):
    """The course's lessons in order (`dlcourse.lessons`): notebooks, strategies in the catalogue."""
    from dlcourse.lessons import LESSONS
    from dlcourse.strategies import STRATEGIES

    for entry in LESSONS:
        count = sum(s.lesson == entry.number for s in STRATEGIES)
        listed = f"  {count} in the catalogue of strategies" if count else ""
        print(f"{entry.number}  {entry.title.ljust(17)}{entry.notebook}{listed}")
    return 0


def plan(args):
    """Rank every layout of a model on a cluster: memory per GPU, speed, MFU, $ per M tokens."""
    from dataclasses import replace

    from dlcourse.planner.catalog import model
    from dlcourse.planner.hardware import Cluster, gpu
    from dlcourse.planner.layouts import Workload, check_ep
    from dlcourse.planner.rank import format_plan, plan as make_plan

    try:
        values = _plan_numbers(args)
        spec, card = model(args.model), gpu(args.gpu)
        card = card if values["price"] is None else card.with_price(values["price"])
        seq_len = values["seq_len"] or spec.seq_len
        tokens = _count(args.tokens_per_step)
        if tokens % seq_len:
            raise ValueError(f"--tokens-per-step {tokens:,} is not a whole number of "
                             f"{seq_len}-token sequences: pass a multiple of {seq_len}")
        cluster = Cluster(card, values["gpus"], values["gpus_per_node"])
        choices = _plan_choices(args)
        if values["ep"] is not None:
            check_ep(spec, values["ep"], values["gpus"])
            choices["experts"] = (values["ep"],)
        work = Workload(replace(spec, seq_len=max(spec.seq_len, seq_len)), seq_len, tokens,
                        attention=args.attention, mlp=args.mlp, loss=args.loss)
        result = make_plan(work, cluster, **choices)
    except ValueError as error:
        print(f"dlcourse plan: {error}", file=sys.stderr)
        return 2
    print(format_plan(result, top=values["top"]))
    return 0 if result.ranked else 1


# flag -> (type, smallest allowed, what to pass): `dlcourse plan`'s numbers, read as text so that
# a bad one gets one line naming the flag (argparse would print its usage, or take "-4" for a flag)
PLAN_NUMBERS = {
    "gpus": (int, 1, "a whole number of GPUs >= 1, e.g. --gpus 64"),
    "gpus_per_node": (int, 1, "a whole number >= 1, e.g. --gpus-per-node 8"),
    "seq_len": (int, 1, "a whole number of tokens >= 1, e.g. --seq-len 4096"),
    "top": (int, 1, "how many rows to print, a whole number >= 1, e.g. --top 8"),
    "price": (float, 1e-9, "dollars per GPU-hour, a number > 0, e.g. --price 2.5"),
    "ep": (int, 1, "expert-parallel ranks, a whole number >= 1 dividing the experts, e.g. --ep 8"),
}


def _plan_choices(args):
    """Check `dlcourse plan`'s named settings, one line naming a bad one and what to pass;
    return the `layouts` choices they narrow."""
    from dlcourse.planner.activations import MLP
    from dlcourse.planner.layouts import ATTENTION, RECOMPUTE
    from dlcourse.planner.transients import LOSS
    named = {"attention": ATTENTION, "mlp": MLP, "recompute": ("any",) + RECOMPUTE, "loss": LOSS}
    for name, allowed in named.items():
        if getattr(args, name) not in allowed:
            what = ", ".join(repr(a) if " " in a else a for a in allowed)
            raise ValueError(f"--{name} takes one of {what}; got {getattr(args, name)!r}")
    return {} if args.recompute == "any" else {"recomputes": (args.recompute,)}


def _plan_numbers(args):
    """{flag: value} of `dlcourse plan`'s numeric flags (None where not given), or a ValueError
    naming the first bad one and what to pass."""
    values = {}
    for name, (kind, least, what) in PLAN_NUMBERS.items():
        text = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if text is None:
            values[name] = None
            continue
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{flag} takes {what}; got {text!r}") from None
        if not least <= value < float("inf"):  # also refuses nan
            raise ValueError(f"{flag} takes {what}; got {text!r}")
        values[name] = value
    return values


def _count(text):
    """'4M' -> 4,194,304 tokens (K, M, G as powers of 2, the way batch sizes are quoted)."""
    what = "a whole number of tokens >= 1, like 4M or 524288"
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    try:
        value = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise ValueError(f"--tokens-per-step takes {what}; got {text!r}") from None
    if not value >= 1 or value != int(value):
        raise ValueError(f"--tokens-per-step takes {what}; got {text!r}")
    return int(value)


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
    for b in built:
        state = ("OUT OF DATE" if args.check else "written") if b.changed else "up to date"
        print(f"{b.exercise}: {state} (from {b.solution})")
    if args.check and any(b.changed for b in built):
        print("run `dlcourse exercises build` to rebuild them", file=sys.stderr)
        return 1
    return 0


def translate(args):
    """Update the catalogues from the English notebooks, or build lessons/zh/ and exercises/zh/
    from them (`--check`: write nothing, exit 1 when a built notebook differs)."""
    import os
    from pathlib import Path

    from dlcourse.i18n import build, catalog

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
    for b in built:
        state = ("OUT OF DATE" if args.check else "written") if b.changed else "up to date"
        print(f"{b.translated}: {state} (from {b.english})")
    if args.check and any(b.changed for b in built):
        print("run `dlcourse translate build` to rebuild them", file=sys.stderr)
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


def _add_exercises(sub):
    p = sub.add_parser("exercises", help="build the exercise notebooks from the solutions")
    actions = p.add_subparsers(dest="action", required=True)
    b = actions.add_parser("build", help=exercises.__doc__)
    b.add_argument("solutions", nargs="*", help="solution notebooks (default: solutions/*.ipynb)")
    b.add_argument("--out", help="folder to write into (default: exercises/ beside solutions/)")
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if an exercise notebook differs from its build")
    b.set_defaults(run=exercises)


def _add_translate(sub):
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


def _add_grade(sub):
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


def _add_tour(sub):
    p = sub.add_parser("tour", help=tour.__doc__)
    p.add_argument("--world-size", type=int, default=4, help="ranks per strategy (default 4)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl with one GPU per rank when there are enough, else gloo")
    p.set_defaults(run=tour)


def _add_plan(sub):
    p = sub.add_parser("plan", help=plan.__doc__)
    p.add_argument("--model", required=True, help="e.g. llama-2-7b, gpt-2-xl, llama-3-405b, "
                                                  "mixtral-8x7b, deepseek-v3")
    p.add_argument("--gpus", required=True, help="GPUs in the job")
    p.add_argument("--gpu", default="h100", help="a100-40gb, a100-80gb, h100, h200, l40s, "
                                                 "rtx-4090 (default h100)")
    p.add_argument("--tokens-per-step", required=True, help="global batch in tokens, e.g. 4M")
    p.add_argument("--seq-len", help="tokens per sequence (default: the model's)")
    p.add_argument("--gpus-per-node", default="8", help="GPUs sharing NVLink (default 8)")
    p.add_argument("--price", help="dollars per GPU-hour (default: the GPU's, see its source)")
    p.add_argument("--top", default="8", help="rows to print (default 8)")
    p.add_argument("--attention", default="fused",
                   help="fused (FlashAttention/SDPA: no s x s scores stored, the default) or "
                        "eager (the scores stored, as lesson 01 measures)")
    p.add_argument("--mlp", default="eager",
                   help="SwiGLU's kernel: eager (plain autograd, 4 ffn-wide tensors saved, the "
                        "default) or fused (Megatron-LM's, 3); no effect on GELU models")
    p.add_argument("--recompute", default="any",
                   help="activation recomputation: any (try all, the default), none, selective "
                        "(Korthikanti's attention scores, eager attention only), op "
                        "(torchtitan's by-op policy: every other matmul and the cheap ops "
                        "recomputed) or full")
    p.add_argument("--ep", help="expert-parallel ranks of an MoE model, borrowed from dp x cp x "
                                "tp (default: try every divisor of its experts)")
    p.add_argument("--loss", default="in place",
                   help="the loss kernel's peak: 'in place' (Megatron-LM, the default), "
                        "'fp32 eager' (torchtitan) or 'fp32 eager, pred kept'")
    p.set_defaults(run=plan)


def _add_info(sub):
    sub.add_parser("info", help=info.__doc__).set_defaults(run=info)


def _add_lessons(sub):
    sub.add_parser("lessons", help=lessons.__doc__).set_defaults(run=lessons)


# each adds one subcommand
COMMANDS = [_add_info, _add_lessons, _add_tour, _add_plan, _add_exercises, _add_translate,
            _add_grade]


def build_parser():
    parser = argparse.ArgumentParser(prog="dlcourse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv=None):
    argv = _glue_negative_values(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    return args.run(args)


def _glue_negative_values(argv):
    """["--seq-len", "-4"] -> ["--seq-len=-4"]: argparse reads a value that starts with "-"
    (like -4M) as a flag; glued, it reaches the subcommand, which says what is wrong with it."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if (a.startswith("--") and "=" not in a and i + 1 < len(argv)
                and argv[i + 1][:1] == "-" and argv[i + 1][1:2].isdigit()):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
