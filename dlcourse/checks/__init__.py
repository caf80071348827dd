"""The checks that grader cells call: a core, and one package per lesson's exercise set, named
with the lesson's one name in the index (`dlcourse.lessons`: `solutions/03_data_parallel.ipynb`
-> `dlcourse/checks/data/`, whose `__init__` exports its `check_*`; a test holds the mapping).
The core runs the student's function on real ranks, compares it with an independent reference,
refuses the lesson's answers (one engine that every set declares its answers to) and fails with
a message a student can act on. The grading engine (`dlcourse.grading`) runs notebooks and
never imports these, save the core's `verdict`; the library never imports them either.

Every set has one shape: `__init__.py` exports its `check_*`; `answers.py` declares `ANSWERS`,
what the set refuses while a student's code runs (an exercise that refuses more or less says so
beside its check, as `ANSWERS.but(...)`); `hints.py` holds `HINTS`, each exercise's hint levels;
the check modules, and the references they share; where its checks run code on ranks,
`in_rank.py`, the harnesses a graded rank loads alone (`ANSWERS.rank_side`).

    core/             run_on_ranks, call_in_process, Submitted (ranks.py); @fresh_cases, the one
                      way to draw cases (cases.py); expect_tensor, fail (expect.py); Answers,
                      the one engine that refuses an answer however it is reached (answers.py,
                      refuse.py, audit.py; communication.py: collectives and the c10d store
                      an exercise forbids); stubs.py; verdict.py (a submission
                      checked apart)
    launch/           lesson 00, the worked example
    memory/           lesson 01: formulas.py
    collectives/      lesson 02: ring_checks.py, time.py, and rings.py (running a ring)
    data/             lesson 03: steps.py, accumulate.py, buckets.py, and replicas.py (whole-batch
                      references, weight comparisons that later lessons' checks reuse; the
                      models and gradient watches a rank needs are in its in_rank.py)
    tensor/           lesson 04: linear.py, operators.py (f and g), qkv.py (the qkv shard),
                      vocab.py (the vocabulary-parallel loss), sequence.py (sequence
                      parallelism's pair and its LayerNorm gradients), cases.py (tp sizes drawn
                      per run)
    zero/             lesson 05: shards.py, steps.py (the sharded step), units.py (a stage-3
                      unit), cases.py (cases drawn per run)
    pipeline/         lesson 06: basics.py, schedules.py (the 1F1B list, run as a schedule),
                      interleaved.py (an interleaved 1F1B list, simulated), loss.py, stages.py
                      (the reference pipeline and its executor)
    combine/          lesson 07: grid.py (the rank grid, the collectives of a grid), plan.py
                      (the planner's cost and choice), pipeline.py, rules.py
    context/          lesson 08: merge.py, zigzag.py, ring.py, ulysses.py, bytes.py,
                      reference.py
    expert/           lesson 09: routing.py, permutation.py, dispatch.py, counting.py, bytes.py,
                      reference.py
    debug/            lesson 10: divergence.py, hang.py, fix.py, naming.py, tied.py, flight.py,
                      runs.py (the recorded runs), reference.py
    checkpoint/       lesson 11: resume.py, reshard.py, complete.py, interval.py
    hints.py          hint(exercise): the next level of an exercise's hints, from its set's table
    summary.py        check_all: every exercise of a notebook checked at once

Import from the set: `from dlcourse.checks.launch import check_gather_all`.
"""
