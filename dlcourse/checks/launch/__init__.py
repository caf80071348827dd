"""Checks for lesson 00's exercises (`exercises/00_launch.ipynb`): a first collective by hand.

    check_gather_all(gather_all)       every rank gets every rank's tensor, stacked in rank order
    check_sum_to_rank0(sum_to_rank0)   rank 0 gets the sum over ranks, the others get None

Each runs the student's function on real ranks (`core.run_on_ranks`) for inputs the notebook
never shows: other world sizes, odd shapes, integer and float dtypes. The reference is plain
single-process torch (`torch.stack`, `.sum`), so it shares no code with a solution. What each
rank received, counted by the kernel outside it, is bounded by what torch's own all_gather or
reduce of the same tensors receives (`core.received`): an all-reduce where a gather or a reduce
belongs fails in the case of 8 KiB a rank, whatever the student's process says.
One module per exercise (`gather_all.py`, `sum_to_rank0.py`), each with its fixed cases; the
case drawn afresh on every run is in `cases.py`.
"""

from dlcourse.checks.launch.gather_all import check_gather_all
from dlcourse.checks.launch.sum_to_rank0 import check_sum_to_rank0

__all__ = ["check_gather_all", "check_sum_to_rank0"]
