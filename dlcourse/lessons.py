"""The index of the course's lessons: one table that the packages' docstrings, `dlcourse
lessons` and the README's check (tests/test_lessons_index.py) read, so that no package lists
the lessons by hand.

A lesson's notebook is `lessons/NN_slug.ipynb`, its exercises `exercises/NN_slug.ipynb`; the
packages that serve it spell it one way, its `name` (`checks/data/`, `strategies/data.py`,
`benchmarks/data.py` for lesson 03). SERVES
names the library's packages (and the catalogue's modules) that teach each lesson, beside what
they hold for it, and `listing(package)` turns them into a docstring's table:

    >>> print(listing("dlcourse.parallel"))    # doctest: +ELLIPSIS
        data/        lesson 03, lessons/03_data_parallel.ipynb
                     DataParallel (naive, bucketed, overlapped), accumulation
    ...
"""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Lesson:
    number: str  # "03"
    slug: str  # lessons/<number>_<slug>.ipynb
    title: str  # as the README's table names it
    name: str  # the one name of its packages: dlcourse/checks/<name>/, strategies/<name>.py, ...

    @property
    def notebook(self):
        return f"lessons/{self.number}_{self.slug}.ipynb"

    @property
    def serves(self):
        """[(dotted module, what it holds for this lesson)] of the library, from SERVES."""
        return [(module, what) for module, (number, what) in SERVES.items()
                if number == self.number]


# The course in order: a lesson's number is its place here; its title (the README's) is the slug
# in words, unless _TITLES names another; its name (its packages') the slug, unless _NAMES does.
_SLUGS = ("launch", "memory", "collectives", "data_parallel", "tensor_parallel", "zero",
          "pipeline", "combining", "context_parallel", "experts", "debugging", "checkpoints")
_TITLES = {"zero": "ZeRO", "checkpoints": "checkpoints and failures"}
_NAMES = {"data_parallel": "data", "tensor_parallel": "tensor", "combining": "combine",
          "context_parallel": "context", "experts": "expert", "debugging": "debug",
          "checkpoints": "checkpoint"}
LESSONS = [Lesson(f"{number:02d}", slug, _TITLES.get(slug, slug.replace("_", " ")),
                  _NAMES.get(slug, slug)) for number, slug in enumerate(_SLUGS)]

SERVES = {  # module of the library -> (the lesson it serves, what it holds for it)
    "dlcourse.launcher": ("00", "`launch`: a function on N ranks from a cell"),
    "dlcourse.memory": ("01", "model state, activations and the true peak, beside the formulas"),
    "dlcourse.collectives": ("02", "collectives, rings from send/recv, alpha-beta, CommCounter"),
    "dlcourse.parallel.data": ("03", "DataParallel (naive, bucketed, overlapped), accumulation"),
    "dlcourse.parallel.timeline": ("03", "the timeline recorder (Span, Timeline, the clock)"),
    "dlcourse.strategies.data": ("03", "the DP variants and torch DDP as catalogue entries"),
    "dlcourse.parallel.tensor": ("04", "Megatron's f and g, column/row layers, SP, DTensor TP"),
    "dlcourse.strategies.tensor": ("04", "TP, TP + SP, DTensor TP, TP with dropout"),
    "dlcourse.parallel.zero": ("05", "ZeRO stages 1-3 and offload, from scratch"),
    "dlcourse.strategies.zero": ("05", "ZeRO 1-3, ZeRO-Offload, ZeroRedundancyOptimizer, FSDP2"),
    "dlcourse.parallel.pipeline": ("06", "stages, schedules as data, one executor"),
    "dlcourse.strategies.pipeline": ("06", "GPipe, 1F1B, ZB-H1, interleaved 1F1B, torch's"),
    "dlcourse.parallel.grid": ("07", "RankGrid: the axes' sizes and each rank's groups"),
    "dlcourse.parallel.rules": ("07", "the one rule book of a grid, each rule with its source"),
    "dlcourse.parallel.combine": ("07", "GridPlan, combine(model, plan, groups) -> GridTrainer"),
    "dlcourse.strategies.combine": ("07", "the rank grids of 4 and 8 ranks"),
    "dlcourse.planner": ("07", "the planner: layouts ranked by memory, time and cost"),
    "dlcourse.parallel.context": ("08", "ring attention, zig-zag, Ulysses, all-gather KV"),
    "dlcourse.strategies.context": ("08", "the GPT context-parallel with each method"),
    "dlcourse.moe": ("09", "the MoE layer: top-k routing, the permutation, capacity"),
    "dlcourse.parallel.expert": ("09", "experts sharded, tokens dispatched by all-to-all"),
    "dlcourse.strategies.expert": ("09", "EP + DP on the MoE GPT"),
    "dlcourse.debug": ("10", "the divergence and hang finders, the catalogue of bugs"),
    "dlcourse.checkpoint": ("11", "resume state, sharded checkpoints, resharding, a rank killed"),
    "dlcourse.strategies.checkpoint": ("11", "the tour's row: a rank killed, the run resumed"),
}


def lesson(number):
    """The Lesson numbered `number` ("03" or 3)."""
    for entry in LESSONS:
        if int(entry.number) == int(number):
            return entry
    raise ValueError(f"no lesson {number}; the course has {LESSONS[0].number}-{LESSONS[-1].number}")


def listing(package):
    """A docstring's table of `package`'s modules in lesson order, each with its lesson and
    notebook on one line and what it holds for that lesson on the next."""
    rows = [(_display(module[len(package) + 1:], package), entry, what) for entry in LESSONS
            for module, what in entry.serves if module.startswith(package + ".")]
    width = max(len(name) for name, _, _ in rows) + 2
    return "\n".join(f"    {name.ljust(width)}lesson {e.number}, {e.notebook}\n"
                     f"    {' ' * width}{what}" for name, e, what in rows)


def _display(name, package):
    """'data/' for a subpackage, 'grid.py' for a module, as a folder listing shows them (read
    from the files: importing them here would import the package being documented)."""
    folder = Path(__file__).parent.parent.joinpath(*package.split("."))
    return f"{name}/" if (folder / name).is_dir() else f"{name}.py"
