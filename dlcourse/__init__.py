"""dlcourse: a hands-on course in distributed training, on real torch.distributed ranks.

Start with `lessons/00_launch.ipynb`; `dlcourse tour` shows the whole course in one table.
"""

from dlcourse.errors import RankError, RankTimeout
from dlcourse.launcher import launch

__version__ = "0.1.0"
__all__ = ["launch", "RankError", "RankTimeout", "__version__"]
