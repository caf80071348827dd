"""What lesson 07's checks (one module per exercise, `rank_coords.py` to `broken_rules.py`) refuse
while a student's code runs, declared to the one engine (`core/answers.py`).

The answers are the lesson's own code: every public function and class of the rank grid
(`dlcourse.parallel.grid`: `RankGrid.coords`, `axis_ranks`, `axis_groups`, ...), of its rule book
(`dlcourse.parallel.rules`: `problems`, `RULES`, ...), of the combined
strategies (`dlcourse.parallel.combine`), of the planner (`dlcourse.planner` and its modules:
`estimate`, `memory_per_gpu`, `plan`, ...) and of lesson 06's schedules and their measures
(`one_f_one_b`, `interleaved_1f1b`, `in_flight_peak`, ...); lesson 01's `model_state_bytes`;
torch's `init_device_mesh` and `DeviceMesh`, which lay ranks out on a grid; and the checks' own
references (`reference_bytes`, ...). Each is refused however it is reached.
"""

from dlcourse.checks.core.answers import Answers

ANSWERS = Answers(
    packages=("dlcourse.parallel.grid", "dlcourse.parallel.rules", "dlcourse.parallel.combine",
              "dlcourse.planner",
              "dlcourse.parallel.pipeline.measure", "dlcourse.parallel.pipeline.schedules"),
    torch=(("torch.distributed.device_mesh", "init_device_mesh"),
           ("torch.distributed.device_mesh", "DeviceMesh")),
    single=(("dlcourse.memory", "model_state_bytes"),),
    checks=("dlcourse.checks.combine",),
    rank_side=())  # formulas: a graded rank runs core's call_in_process side only, none of these
