"""The tour's combined rows (lesson 07, `lessons/07_combining.ipynb`): the catalogue's rank
grids (`dlcourse.strategies.combine`: `PLANS`), checked and trained one by one as the lesson
measures them, by the tour's one row runner (`rows.py`)."""

from dlcourse.strategies import CATALOGUE
from dlcourse.strategies.combine import PLANS
from dlcourse.tour.rows import run_rows

__all__ = ["PLANS", "check_grid_row", "train_grid_row"]


def check_grid_row(name, cfg, world_size):
    """Before any rank starts: the grid's size is the job's, and the model fits it."""
    CATALOGUE[name].check(cfg, world_size)


def train_grid_row(name, cfg):
    """On every rank: `name`'s row (a key of PLANS) as the tour runs it: a `RowResult`."""
    if name not in PLANS:
        raise ValueError(f"unknown grid row {name!r}; choose from {list(PLANS)}")
    return run_rows([CATALOGUE[name]], cfg)[0]
