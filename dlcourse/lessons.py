"""The index of the course's lessons: one table that the packages' docstrings, `dlcourse
lessons` and the README's check (tests/test_lessons_index.py) read, so that no package lists
the lessons by hand.

A lesson's notebook is `lessons/NN_slug.ipynb`, its exercises `exercises/NN_slug.ipynb`; `serves`
names the library's packages (and the catalogue's modules) that teach it, each beside what it
holds for that lesson, and `listing(package)` turns them into a docstring's table:

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
    serves: tuple = ()  # (dotted module, what it holds for this lesson) of the library

    @property
    def notebook(self):
        return f"lessons/{self.number}_{self.slug}.ipynb"


LESSONS = [
    Lesson("00", "launch", "launch", (
        ("dlcourse.launcher", "`launch`: a function on N ranks from a cell"),)),
    Lesson("01", "memory", "memory", (
        ("dlcourse.memory", "model state, activations and the true peak, beside the formulas"),)),
    Lesson("02", "collectives", "collectives", (
        ("dlcourse.collectives", "collectives, rings from send/recv, alpha-beta, CommCounter"),)),
    Lesson("03", "data_parallel", "data parallel", (
        ("dlcourse.parallel.data", "DataParallel (naive, bucketed, overlapped), accumulation"),
        ("dlcourse.parallel.timeline", "the timeline recorder (Span, Timeline, the clock)"),
        ("dlcourse.strategies.data", "the DP variants and torch DDP as catalogue entries"))),
    Lesson("04", "tensor_parallel", "tensor parallel", (
        ("dlcourse.parallel.tensor", "Megatron's f and g, column/row layers, SP, DTensor TP"),
        ("dlcourse.strategies.tensor", "TP, TP + SP, DTensor TP, TP with dropout"))),
    Lesson("05", "zero", "ZeRO", (
        ("dlcourse.parallel.zero", "ZeRO stages 1-3 and offload, from scratch"),
        ("dlcourse.strategies.zero", "ZeRO 1-3, ZeRO-Offload, ZeroRedundancyOptimizer, FSDP2"))),
    Lesson("06", "pipeline", "pipeline", (
        ("dlcourse.parallel.pipeline", "stages, schedules as data, one executor"),
        ("dlcourse.strategies.pipeline", "GPipe, 1F1B, ZB-H1, interleaved 1F1B, torch's"))),
    Lesson("07", "combining", "combining", (
        ("dlcourse.parallel.grid", "RankGrid: the axes' sizes and each rank's groups"),
        ("dlcourse.parallel.combine", "GridPlan, combine(model, plan, groups) -> GridTrainer"),
        ("dlcourse.strategies.combine", "the rank grids of 4 and 8 ranks"),
        ("dlcourse.planner", "the planner: layouts ranked by memory, time and cost"))),
    Lesson("08", "context_parallel", "context parallel", (
        ("dlcourse.parallel.context", "ring attention, zig-zag, Ulysses, all-gather KV"),
        ("dlcourse.strategies.context", "the GPT context-parallel with each method"))),
    Lesson("09", "experts", "experts", (
        ("dlcourse.moe", "the MoE layer: top-k routing, the permutation, capacity"),
        ("dlcourse.parallel.expert", "experts sharded, tokens dispatched by all-to-all"),
        ("dlcourse.strategies.expert", "EP + DP on the MoE GPT"))),
    Lesson("10", "debugging", "debugging", (
        ("dlcourse.debug", "the divergence and hang finders, the catalogue of bugs"),)),
]


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
