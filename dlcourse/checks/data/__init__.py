"""Checks for lesson 03's exercises (`exercises/03_data_parallel.ipynb`): data parallelism by hand.

    check_broadcast_parameters(broadcast_parameters)  every rank starts from rank 0's weights
    check_data_parallel_step(data_parallel_step)     steps equal to one process's on the batch
    check_make_buckets(make_buckets)                 the plan: which gradients travel together
    check_all_reduce_buckets(all_reduce_buckets)     one all-reduce per bucket, averages in .grad
    check_accumulate_step(accumulate_step)           micro-batches under no_sync(), one sync a step

One module per exercise (`broadcast_parameters.py`, `data_parallel_step.py`, `make_buckets.py`,
`all_reduce_buckets.py`, `accumulate_step.py`); the pieces they share in `replicas.py`.
Each runs the student's code on 4, 3 and 2 real gloo ranks with models the notebook never shows (a
small MLP, the course GPT with its tied embedding and output weight, an MLP with a parameter no
layer uses and a frozen one), and compares every rank's weights after every step (or gradients)
with one process training the same model on the whole batch. Accumulation runs under the lesson's
`DataParallel` and under torch's `DistributedDataParallel`: the same loop must work with both.

SGD is the sharp reference: it moves a weight by lr x gradient, so the check reads back the
gradient a step used and names the mistake that gives it (the sum over ranks, a rank's own, equal
weights for unequal shards, the previous step's left in .grad, ...). AdamW would hide a missing
divide (it divides by the gradient's own size), but unlike SGD it is not linear, so one AdamW case
catches parameters averaged after each rank's own step. What each rank communicated is watched:
no all-reduce of a parameter's values, none before the last micro-batch, one per bucket.
"""

from dlcourse.checks.data.accumulate_step import check_accumulate_step
from dlcourse.checks.data.all_reduce_buckets import check_all_reduce_buckets
from dlcourse.checks.data.broadcast_parameters import check_broadcast_parameters
from dlcourse.checks.data.data_parallel_step import check_data_parallel_step
from dlcourse.checks.data.make_buckets import check_make_buckets

__all__ = ["check_broadcast_parameters", "check_data_parallel_step", "check_accumulate_step",
           "check_make_buckets", "check_all_reduce_buckets"]
