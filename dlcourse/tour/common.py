"""The names lesson 07 (`lessons/07_combining.ipynb`) and the tests import from the tour: its
configuration, the result a row returns and the tolerance rows are judged by. They live in the
catalogue (`dlcourse.strategies`)."""

from dlcourse.strategies.config import MATCH_TOLERANCE, TourConfig
from dlcourse.strategies.trainer import RowResult

__all__ = ["MATCH_TOLERANCE", "RowResult", "TourConfig"]
