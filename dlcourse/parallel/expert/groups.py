"""Expert parallelism inside data parallelism: the expert-data-parallel group (lesson 09,
`lessons/09_experts.ipynb`, Step 3).

With dp data-parallel ranks and experts dealt out over ep of them (ep divides dp), the world is
a (dp/ep) x ep grid, ep innermost: ranks r·ep .. r·ep + ep - 1 form an expert-parallel group,
which holds all E experts between them. Ranks at the same place in their EP groups hold the same
E/ep experts: an **expert-data-parallel** (EDP) group of dp/ep ranks (torchtitan's sparse mesh,
("dp_replicate", "efsdp", "ep"), read at commit b5bcd76, 21 August 2026: efsdp = dp·tp/ep).
4 ranks, ep = 2: EP groups {0, 1} and {2, 3}, EDP groups {0, 2} and {1, 3}.

    ep_layout(world_size, ep)   # ([EP groups], [EDP groups]) as lists of ranks: arithmetic only
    new_expert_groups(ep)       # on every rank: (its EP group, its EDP group or None)

The gradients, with L = (1/dp) Σ_r L_r the mean over the dp ranks' equal shards:
  dense     every rank holds ∇L_r: all-reduce over the dp group, / dp (lesson 03).
  experts   the combine's backward brings each EP group's ∂L_r/∂(rows) to the expert's owner:
            Σ_{r in its EP group} ∇_e L_r. The other EP groups' copies of the expert hold the
            rest: all-reduce over the EDP group gives Σ_r ∇_e L_r; / dp.
  (`parallelize.average_gradients(model, ep_group, dp_group, edp_group)`.) With dp = ep there is
  no EDP group and the experts see no collective on their gradients at all.
"""

import torch.distributed as dist


def ep_layout(world_size, ep):
    """([EP groups], [EDP groups]) as lists of ranks, ep innermost; refuses ep not dividing."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep must be a whole number of ranks >= 1, got {ep!r}")
    if world_size % ep:
        raise ValueError(f"ep {ep} does not divide the {world_size} data-parallel ranks "
                         f"({world_size} / {ep} = {world_size / ep:g}): every EP group holds "
                         f"all experts once; use ep a divisor of {world_size}")
    ep_groups = [list(range(start, start + ep)) for start in range(0, world_size, ep)]
    edp_groups = [list(range(place, world_size, ep)) for place in range(ep)]
    return ep_groups, edp_groups


def new_expert_groups(ep, group=None):
    """Called on every rank of `group` (default: the world, the data-parallel ranks): creates
    every EP and EDP group (torch wants each created on all ranks, in one order) and returns
    (this rank's EP group, its EDP group, or None when dp = ep and there is none)."""
    group = group or dist.group.WORLD
    world = dist.get_process_group_ranks(group)  # global ranks, in group order
    ep_groups, edp_groups = ep_layout(len(world), ep)
    rank = dist.get_rank(group)
    mine = {}
    for kind, layout in (("ep", ep_groups), ("edp", edp_groups)):
        if kind == "edp" and len(layout[0]) == 1:
            mine[kind] = None  # dp = ep: every expert has one copy
            continue
        for ranks in layout:
            made = dist.new_group([world[r] for r in ranks])
            if rank in ranks:
                mine[kind] = made
    return mine["ep"], mine["edp"]
