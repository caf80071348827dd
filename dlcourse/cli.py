"""The `dlcourse` command: `info`, `tour`, and the instructor's tools.

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
    if failed:
        print(f"\nNOT equal to the reference (tolerance {tour_module.MATCH_TOLERANCE:g}): "
              + ", ".join(failed))
        return 1
    print(f"\nEvery strategy matches the single-process reference within "
          f"{tour_module.MATCH_TOLERANCE:g} (rounding in a different summation order).")
    return 0


def _add_tour(sub):
    p = sub.add_parser("tour", help=tour.__doc__)
    p.add_argument("--world-size", type=int, default=4, help="ranks per strategy (default 4)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl with one GPU per rank when there are enough, else gloo")
    p.set_defaults(run=tour)


def _add_info(sub):
    sub.add_parser("info", help=info.__doc__).set_defaults(run=info)


COMMANDS = [_add_info, _add_tour]  # each adds one subcommand to the parser


def build_parser():
    parser = argparse.ArgumentParser(prog="dlcourse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
