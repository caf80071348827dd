"""The checks that grader cells call, one module per lesson's exercise set, named after the
solution notebook's topic (`solutions/NN_topic.ipynb` -> `dlcourse/checks/topic.py`; a test holds
the mapping), all built on `core.py`: run the student's function on real ranks, compare with an
independent reference, refuse the library's own answer, and fail with a message a student can act
on. The grading engine (`dlcourse.grading`) runs notebooks and never imports these; the library
never imports them either.

    core.py           run_on_ranks, call_in_process, expect_tensor, refusals (the worked example
                      is launch.py)
    launch.py         lesson 00
    memory.py         lesson 01
    collectives.py    lesson 02, with rings.py (the ring exercises)
    data_parallel.py  lesson 03, with buckets.py and replicas.py (models, whole-batch references,
                      gradient watches, weight comparisons that later lessons' checks reuse)
    tensor_parallel.py  lesson 04, with tensor_layers.py (the qkv shard, the vocabulary-parallel
                      loss) and tensor_library.py (refusals, tp sizes drawn per run)
    zero.py           lesson 05, with zero_steps.py (the sharded step), zero_units.py (a stage-3
                      unit), zero_cases.py (cases drawn per run) and zero_library.py (refusals)
    pipeline.py       lesson 06, with schedules.py (the 1F1B list and the loss scaling, run as a
                      schedule) and stages.py (the reference pipeline, its executor, refusals)
    combining.py      lesson 07 (the rank grid, the collectives and bytes of a grid), with
                      combining_plan.py (the planner's cost and choice) and combining_library.py
                      (refusals: RankGrid, combine, the planner, DeviceMesh)

Import from the module: `from dlcourse.checks.launch import check_gather_all`.
"""
