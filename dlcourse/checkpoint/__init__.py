"""Checkpoints and failures (lesson 11, `lessons/11_checkpoints.ipynb`): what a resume needs, sharded
state saved by one layout and loaded by another, a rank killed and the run resumed bit for bit.

    run.py       the run lesson 11 interrupts: TP GPT with dropout, AdamW, LR schedule, data stream
    resume.py    resume_state / restore: what a resume needs
    forgetting.py lesson 10's finder naming where a resume that forgets a piece parts
    files.py     a checkpoint folder that is whole or absent: write, then commit by one rename
    boxes.py     which part of a whole tensor a shard holds (offsets, sizes), and their overlap
    sharded.py   each rank writes its pieces, one metadata file; any layout loads from it
    reshard.py   ZeRO-3 on N -> ZeRO-3 on M, DP x TP -> ZeRO-3, on real ranks
    failures.py  a rank SIGKILLed mid-run, the job restarted, steps redone counted
    torch_api.py the same with torch.distributed.checkpoint (dcp.save / load, async_save)

What failures cost at scale (interruptions, Young's interval, goodput) is the planner's:
`dlcourse/planner/goodput.py`.
"""

from dlcourse.checkpoint.files import CheckpointError, latest, read_metadata, save_checkpoint
from dlcourse.checkpoint.resume import PIECES, restore, resume_state
from dlcourse.checkpoint.run import RunConfig, TrainRun

__all__ = ["PIECES", "CheckpointError", "RunConfig", "TrainRun", "latest", "read_metadata",
           "restore", "resume_state", "save_checkpoint"]
