"""ZeRO from scratch (lesson 05, `lessons/05_zero.ipynb`): the Zero Redundancy Optimizer of
Rajbhandari et al. 2019 removes data parallelism's redundant copies of the model state, one part
at a time; every rank keeps 1/N of each partitioned part.

    shards.py   FlatShard: parameters end to end in a flat buffer, padded, cut into N shards
    stage1.py   ZeroStage1: optimizer state partitioned (reduce-scatter, step, all-gather)
    stage2.py   ZeroStage2: gradients too, reduce-scattered from hooks during backward
    stage3.py   ZeroStage3: parameters too, gathered unit by unit, freed, prefetched
    optim.py    ZeroAdamW: the optimizer of every stage (mixed precision: fp32 master shard)
    offload.py  the optimizer on the CPU (ZeRO-Offload on stage 2; stage 3: ZeRO-Infinity's)
    clip.py     gradient clipping by the global norm of the shards (one scalar all-reduce)
    measure.py  bytes held per rank, peak and communication, beside ZeRO's formulas
    torch_api.py  ZeroRedundancyOptimizer and FSDP2 (fully_shard) the same way

Every stage wraps the plain model for a process group; the training loop is lesson 03's.
"""

from dlcourse.parallel.zero.optim import ZeroAdamW
from dlcourse.parallel.zero.shards import FlatShard, shard_bounds, shard_numel
from dlcourse.parallel.zero.stage1 import ZeroStage1
from dlcourse.parallel.zero.stage2 import ZeroStage2
from dlcourse.parallel.zero.stage3 import ZeroStage3

STAGES = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}


def zero(stage, model, group, **options):
    """Wrap `model` for ZeRO `stage` (1, 2 or 3) over `group`."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO has stages 1, 2 and 3, got {stage!r}")
    return STAGES[stage](model, group, **options)


__all__ = [
    "STAGES",
    "FlatShard",
    "ZeroAdamW",
    "ZeroStage1",
    "ZeroStage2",
    "ZeroStage3",
    "shard_bounds",
    "shard_numel",
    "zero",
]
