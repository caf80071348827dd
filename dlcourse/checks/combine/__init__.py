"""Checks for lesson 07's exercises (`exercises/07_combining.ipynb`): the rank grid by hand, and
the planner's arithmetic.

    check_rank_coords(rank_coords)            rank -> {"pp", "dp", "tp"} coordinates, any order
    check_axis_groups(axis_groups)            every group of one axis: the ranks that differ on it
    check_step_collectives(step_collectives)  which collectives one step issues on which axis
    check_grid_state_bytes(grid_state_bytes)  model-state bytes per rank of a grid with ZeRO on dp
    check_cost_per_million_tokens(...)        dollars per million tokens from a step time
    check_best_layout(best_layout)            of three layouts: the cheapest one that fits
    check_first_stage_activation_bytes(...)   the first pipeline rank's activations, 1F1B and
                                              interleaved (`first_stage_activation_bytes.py`)
    check_broken_rules(broken_rules)          the rule book's rules a model and grid break,
                                              graded by the runtime's own (`broken_rules.py`)

One module per exercise, named after it (`rank_coords.py`, `axis_groups.py`, `step_collectives.py`,
`grid_state_bytes.py`, `cost_per_million_tokens.py`, `best_layout.py`,
`first_stage_activation_bytes.py`, `broken_rules.py`), the grids they draw in `grids.py`, a step's
cost in `costs.py`, the refusals in `answers.py`. Every check draws its cases afresh on each run
(`core.fresh_cases`; a failure names the seed): grids of 2 to 16 ranks, 1 to 4 per axis, the axes in
a random order, the first grid with all three axes above 1 in an order other than the default, so an
answer right for one grid shape or one order fails. The references share no code with a solution:
the grid is enumerated with itertools.product in its order (C order, the last axis fastest), not
computed with divmod; the collectives are the table of lessons 03-06 written out per axis, which
tests/test_checks_combine_references.py holds equal to what `combine` issues on 6 ranks, counted at
torch's dispatcher.
"""

from dlcourse.checks.combine.axis_groups import check_axis_groups
from dlcourse.checks.combine.best_layout import check_best_layout
from dlcourse.checks.combine.broken_rules import RULE_NAMES, check_broken_rules
from dlcourse.checks.combine.cost_per_million_tokens import check_cost_per_million_tokens
from dlcourse.checks.combine.first_stage_activation_bytes import check_first_stage_activation_bytes
from dlcourse.checks.combine.grid_state_bytes import check_grid_state_bytes
from dlcourse.checks.combine.rank_coords import check_rank_coords
from dlcourse.checks.combine.step_collectives import check_step_collectives

__all__ = ["check_rank_coords", "check_axis_groups", "check_step_collectives",
           "check_grid_state_bytes", "check_cost_per_million_tokens", "check_best_layout",
           "check_first_stage_activation_bytes", "check_broken_rules", "RULE_NAMES"]
