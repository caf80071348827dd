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
one module per exercise (a cell the student fills: a pair of functions written in one cell is
one exercise), named after it, and the references and helpers they share; where its checks run
code on ranks, `in_rank.py`, the harnesses a graded rank loads alone (`ANSWERS.rank_side`).

    core/             run_on_ranks, call_in_process, Submitted (ranks.py); @fresh_cases, the one
                      way to draw cases (cases.py); expect_tensor, fail (expect.py); Answers,
                      the one engine that refuses an answer however it is reached (answers.py,
                      refuse.py, audit.py; communication.py: collectives and the c10d store
                      an exercise forbids); stubs.py; verdict.py (a submission
                      checked apart)
    launch/           lesson 00, the worked example: gather_all.py, sum_to_rank0.py, cases.py
    memory/           lesson 01: count_gpt_params.py, zero_model_state.py, mlp_activation_bytes.py,
                      calls.py (calling a formula, reading what it returned)
    collectives/      lesson 02: ring_reduce_scatter.py, ring_all_gather.py, ring_all_reduce.py,
                      all_reduce_time.py, rings.py (running a ring), cases.py (the ring's inputs)
    data/             lesson 03: broadcast_parameters.py, data_parallel_step.py, make_buckets.py,
                      all_reduce_buckets.py, accumulate_step.py, and replicas.py (whole-batch
                      references, weight comparisons that later lessons' checks reuse; the
                      models and gradient watches a rank needs are in its in_rank.py)
    tensor/           lesson 04: column_parallel_linear.py, row_parallel_linear.py,
                      megatron_f.py, megatron_g.py, qkv_shard.py,
                      vocab_parallel_cross_entropy.py, sequence_parallel.py (SP's pair),
                      sync_layernorm_grads.py; layers.py (the layer the first four draw and run),
                      sequence_block.py (SP's block and reference), cases.py (tp sizes drawn
                      per run)
    zero/             lesson 05: shard_of.py, zero_step.py (the sharded step), gather_and_free.py
                      (a stage-3 unit), zero_bytes_per_rank.py, cases.py (cases drawn per run)
    pipeline/         lesson 06: stage_boundaries.py, exchange.py, last_stage_backward.py,
                      schedule_1f1b.py (the 1F1B list, run as a schedule), bubble_fraction.py,
                      schedule_interleaved.py (an interleaved 1F1B list, simulated), stages.py
                      (the reference pipeline and its executor)
    combine/          lesson 07: rank_coords.py, axis_groups.py, step_collectives.py,
                      grid_state_bytes.py, cost_per_million_tokens.py, best_layout.py,
                      first_stage_activation_bytes.py, broken_rules.py; grids.py (the grids
                      drawn), costs.py (a step's cost)
    context/          lesson 08: merge_partials.py, zigzag_positions.py, ring_attention_step.py,
                      seq_to_heads.py, cp_bytes_per_layer.py; ring_mistakes.py (the wrong ring
                      steps recognised), reference.py
    expert/           lesson 09: route_with_capacity.py, load_balance_loss.py,
                      dispatch_to_experts.py, moe_layer_counts.py, a2a_bytes_per_layer.py,
                      permutation.py (a pair); reference.py, cases.py (the router logits drawn)
    debug/            lesson 10: first_divergence.py, mismatched_call.py,
                      sync_sequence_parallel_grads.py, name_the_bug.py, sync_tied_grads.py,
                      waited_call.py, runs.py (the recorded runs), reference.py
    checkpoint/       lesson 11: resume_state.py, load_my_shard.py, is_complete.py,
                      checkpoint_interval.py
    hints.py          hint(exercise): the next level of an exercise's hints, from its set's table
    summary.py        check_all: every exercise of a notebook checked at once

Import from the set: `from dlcourse.checks.launch import check_gather_all`.
"""
