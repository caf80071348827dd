"""Parallel training strategies, one subpackage each; every one takes a plain model and the
process group of its axis, never a global.

    data/       data parallelism (lesson 03, `lessons/03_data_parallel.ipynb`)
    tensor/     tensor and sequence parallelism (lesson 04, `lessons/04_tensor_parallel.ipynb`)
    zero/       ZeRO stages 1-3 and offload (lesson 05, `lessons/05_zero.ipynb`)
    pipeline/   stages, schedules as data, one executor (lesson 06, `lessons/06_pipeline.ipynb`)
    context/    ring attention, zig-zag, Ulysses, all-gather-KV: the sequence split over ranks
                (lesson 08, `lessons/08_context_parallel.ipynb`)
    expert/     expert parallelism for the MoE GPT: experts sharded, tokens dispatched by
                all-to-all of uneven splits (lesson 09, `lessons/09_experts.ipynb`)
    grid.py     RankGrid: the sizes of the dp, cp, tp and pp axes (and virtual stages) and each
                rank's groups (lesson 07), built once and handed down, so a strategy takes
                `groups.dp` or `groups.tp`; the one grid description the planner uses too
    rules.py    the one rule book of a grid (`problems`), each rule with its source: what the
                runtime refuses and the planner never ranks (lesson 07)
    combine.py  GridPlan, combine(model, plan, groups) -> GridTrainer: pp stages, tp inside each,
                DP or ZeRO on dp, proven equal to one process (lesson 07)

Each strategy offers what `dlcourse tour` composes: a way to wrap the plain model for a group,
the training step, and a count of one step's communication (lesson 02's `CommCounter`).
"""
