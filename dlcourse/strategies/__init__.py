"""The catalogue of strategies: every way the course trains its GPT on several ranks, declared
once. `dlcourse tour` prints a row for each, lesson 10's divergence finder (`dlcourse.debug`)
runs each against one process, and `benchmarks/` times them; all three read `CATALOGUE`.

An entry (`Strategy`, `catalogue.py`) says: its name, its lesson, the grid it needs at a world
size (`grid(cfg, world_size)`, a ValueError when it cannot run there; `ranks` when it runs on
one size only), and `build(cfg, groups)`, which returns one `Trainer` (`trainer.py`) on every
rank: it trains a step on the global batch, reports its state bytes and one step's
communication and activations, and hands the finder its modules, optimizer (for the gathered
gradients) and `full_parameters`. A strategy compared with another model than the plain GPT
names it (`reference`, `loss`). `config.py` holds the `StrategyConfig` every build reads,
`trainer.py` the `Trainer` and the counts every build shares; the builds live by lesson, named
as `parallel/`'s packages (from the course's index, `dlcourse.lessons`):

{listing}

Adding a strategy for a new lesson, in order:
  1. its code in `dlcourse/parallel/<name>/` (the model never knows about ranks; groups passed in);
  2. a build here, `dlcourse/strategies/<name>.py`: `build(cfg, groups) -> Trainer` (a custom
     `count` or `state_bytes` only where the defaults do not measure it, e.g. a pipeline's sends);
  3. its entry in `catalogue.py`'s STRATEGIES (name, lesson, grid, build; `ranks` if it needs a
     fixed world size; `reference` if it is not compared with the plain GPT; `own_job` for a row
     that must not share the tour's job, as lesson 11's that kills a rank, and `finder=False`
     where the finder cannot run it);
  4. its exercise set in `dlcourse/checks/`, its lesson, and its line (with this module) in
     `dlcourse/lessons.py`.
The tour's row, the finder's subject (tests/test_debug_tour.py runs every entry through it) and
the benchmarks' run then follow from the entry.

    from dlcourse.strategies import CATALOGUE
    trainer = CATALOGUE["TP + SP (lesson 04)"].build(cfg, groups)   # on every rank of a job
"""

from dlcourse.lessons import listing
from dlcourse.strategies.catalogue import CATALOGUE, STRATEGIES, NeedsRanks, Strategy
from dlcourse.strategies.config import MATCH_TOLERANCE, StrategyConfig, TourConfig
from dlcourse.strategies.trainer import Trainer

__doc__ = __doc__.replace("{listing}", listing(__name__))
__all__ = ["CATALOGUE", "MATCH_TOLERANCE", "STRATEGIES", "NeedsRanks", "Strategy",
           "StrategyConfig", "TourConfig", "Trainer"]
