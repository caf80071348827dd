"""The `dlcourse` command: `info`, `lessons`, `tour`, `plan`, and the instructor's tools
(`dlcourse.instructor`: `exercises build`, `translate`, `grade`).

Each subcommand is a small function that takes the parsed arguments; `COMMANDS` lists them.
"""

import argparse
import sys

from dlcourse import instructor


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
        result = make_plan(work, cluster, include_failures=not args.no_failures, **choices)
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


# flag -> (default, what each value means): `dlcourse plan`'s named settings, each checked
# against the planner's own table of its values (`_plan_choices`)
PLAN_SETTINGS = {
    "attention": ("fused", "fused (FlashAttention/SDPA: no s x s scores stored, the default) or "
                           "eager (the scores stored, as lesson 01 measures)"),
    "mlp": ("eager", "SwiGLU's kernel: eager (plain autograd, 4 ffn-wide tensors saved, the "
                     "default) or fused (Megatron-LM's, 3); no effect on GELU models"),
    "recompute": ("any", "activation recomputation: any (try all, the default), none, selective "
                         "(Korthikanti's attention scores, eager attention only), op "
                         "(torchtitan's by-op policy: every other matmul and the cheap ops "
                         "recomputed) or full"),
    "loss": ("in place", "the loss kernel's peak: 'in place' (Megatron-LM, the default), "
                         "'fp32 eager' (torchtitan) or 'fp32 eager, pred kept'"),
}


def _plan_choices(args):
    """Check `dlcourse plan`'s named settings (PLAN_SETTINGS), one line naming a bad one and
    what to pass; return the `layouts` choices they narrow."""
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
    for name, (default, text) in PLAN_SETTINGS.items():
        p.add_argument("--" + name, default=default, help=text)
    p.add_argument("--ep", help="expert-parallel ranks of an MoE model, borrowed from dp x cp x "
                                "tp (default: try every divisor of its experts)")
    p.add_argument("--no-failures", action="store_true",
                   help="leave failures out: tokens/s and $ per step as if nothing failed "
                        "(default: times the goodput of lesson 11, planner/failures.py)")
    p.set_defaults(run=plan)


def _add_info(sub):
    sub.add_parser("info", help=info.__doc__).set_defaults(run=info)


def _add_lessons(sub):
    sub.add_parser("lessons", help=lessons.__doc__).set_defaults(run=lessons)


# each adds one subcommand
COMMANDS = [_add_info, _add_lessons, _add_tour, _add_plan, instructor.add_exercises,
            instructor.add_translate, instructor.add_grade]


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
