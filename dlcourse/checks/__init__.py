"""The checks that grader cells call: a core, and one package per lesson's exercise set, named
with the lesson's one name in the index (`dlcourse.lessons`: `solutions/03_data_parallel.ipynb`
-> `dlcourse/checks/data/`, whose `__init__` exports its `check_*`; a test holds the mapping).
The core runs the student's function on real ranks, compares it with an independent reference, refuses the lesson's answers
(one engine that every set declares its answers to) and fails with a message a student can act
on. The grading engine (`dlcourse.grading`) runs notebooks and never imports these, save the
core's `verdict`; the library never imports them either.

    core/             run_on_ranks, call_in_process, Submitted (ranks.py); draw, @fresh_cases
                      (cases.py); expect_tensor, fail (expect.py); the refusal mechanisms
                      (refuse.py); Answers, the one answer-blocking engine (answers.py);
                      stubs.py; verdict.py (a submission checked apart)
    launch/           lesson 00, the worked example
    memory/           lesson 01: formulas.py
    collectives/      lesson 02: ring_checks.py, time.py, and rings.py (running a ring)
    data/             lesson 03: steps.py, accumulate.py, buckets.py, and replicas.py (models,
                      whole-batch references, gradient watches, weight comparisons that later
                      lessons' checks reuse; DATA_PARALLEL, the answers)
    tensor/           lesson 04: linear.py, operators.py (f and g), layers.py (the qkv shard,
                      the vocabulary-parallel loss), sequence.py (sequence parallelism's pair
                      and its LayerNorm gradients), refused.py (TENSOR, tp sizes drawn per run)
    zero/             lesson 05: shards.py, steps.py (the sharded step), units.py (a stage-3
                      unit), cases.py (cases drawn per run), refused.py (ZERO)
    pipeline/         lesson 06: basics.py, schedules.py (the 1F1B list, run as a schedule),
                      interleaved.py (an interleaved 1F1B list, simulated), loss.py, stages.py
                      (the reference pipeline, its executor, PIPELINE)
    combine/          lesson 07: grid.py (the rank grid, the collectives of a grid), plan.py
                      (the planner's cost and choice), pipeline.py, refused.py (COMBINING)
    context/          lesson 08: merge.py, zigzag.py, ring.py, ulysses.py, reference.py,
                      refusals.py (CONTEXT)
    expert/           lesson 09: routing.py, dispatch.py, counting.py, reference.py,
                      refusal.py (EXPERTS)
    debug/            lesson 10: divergence.py, hang.py, fix.py, runs.py (the recorded runs),
                      reference.py, refusal.py (DEBUGGING)
    checkpoint/       lesson 11: resume.py, reshard.py, complete.py, interval.py, refusal.py
    hints.py          hint(exercise): the next level of an exercise's hints, from its set's
                      hints.py; summary.py: check_all

Import from the set: `from dlcourse.checks.launch import check_gather_all`.
"""
