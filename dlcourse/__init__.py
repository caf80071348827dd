"""dlcourse: a hands-on course in distributed training, on real torch.distributed ranks.

Start with `lessons/00_launch.ipynb`; `dlcourse tour` shows the whole course in one table.
"""

from dlcourse.errors import RankError, RankTimeout

__version__ = "0.1.0"
__all__ = ["launch", "RankError", "RankTimeout", "__version__"]


def __getattr__(name):
    """`dlcourse.launch`, imported when first asked for (PEP 562): it brings torch, which a
    process that only grades or reads notebooks (`dlcourse.grading`, nbval's plugin) never
    needs, and which takes over a second to import."""
    if name == "launch":
        from dlcourse.launcher import launch
        return launch
    raise AttributeError(f"module 'dlcourse' has no attribute {name!r}")
