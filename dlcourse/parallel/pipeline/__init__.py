"""Pipeline parallelism from scratch (lesson 06, `lessons/06_pipeline.ipynb`).

The course GPT cut into stages, one run of layers per rank (`stages.py`); activations and their
gradients passed between neighbours (`p2p.py`); schedules as data, one small function each:
naive, GPipe, 1F1B, interleaved 1F1B, ZB-H1 (`schedules.py`); one executor that runs any of
them and records when each action ran (`executor.py`); the bubble and memory they predict,
against what a run measures (`measure.py`); torch.distributed.pipelining on the same stages
(`torch_api.py`).
"""

from dlcourse.parallel.pipeline.executor import run_schedule, split_micro_batches, train_step
from dlcourse.parallel.pipeline.schedules import (SCHEDULES, Action, gpipe, interleaved_1f1b,
                                                  naive, one_f_one_b, zb_h1)
from dlcourse.parallel.pipeline.stages import (Stage, cut_stages, gather_params, stage_boundaries,
                                               sync_tied_grads)

__all__ = ["Action", "SCHEDULES", "Stage", "cut_stages", "gather_params", "gpipe",
           "interleaved_1f1b", "naive", "one_f_one_b", "run_schedule", "split_micro_batches",
           "stage_boundaries", "sync_tied_grads", "train_step", "zb_h1"]
