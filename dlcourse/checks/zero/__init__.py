"""Checks for lesson 05's exercises (`exercises/05_zero.ipynb`): ZeRO by hand.

    check_shard_of(shard_of)                         a rank's piece of the padded flat buffer
    check_zero_step(zero_step)                       reduce-scatter, Adam on the shard, all-gather
    check_gather_and_free(gather_and_free)           stage 3: one unit gathered and freed
    check_zero_bytes_per_rank(zero_bytes_per_rank)   model-state bytes per rank, padding included

One module per exercise: the shard in `shard_of.py`, the step in `zero_step.py`, the stage-3 unit in
`gather_and_free.py`, the bytes in `zero_bytes_per_rank.py`; how cases are drawn and the models in
`cases.py`, what is refused in `answers.py`. Every check draws its cases afresh on each run (world
sizes 2 to 4, parameter shapes, models, batches, dtypes) from a seed that a failure names
(`core.fresh_cases`); `check_x(fn, seed=S)` replays a run. Every run holds a case where N does not
divide Ψ, so an answer right only for a multiple of N fails. The references share no code with a
solution: the flat buffer sliced in this process; one process training on the whole batch with
torch's AdamW; the same model's gradients with nothing sharded; the storages a rank holds, allocated
and counted.
"""

from dlcourse.checks.zero.gather_and_free import check_gather_and_free
from dlcourse.checks.zero.shard_of import check_shard_of
from dlcourse.checks.zero.zero_bytes_per_rank import check_zero_bytes_per_rank
from dlcourse.checks.zero.zero_step import check_zero_step

__all__ = ["check_shard_of", "check_zero_bytes_per_rank", "check_zero_step",
           "check_gather_and_free"]
