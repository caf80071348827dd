"""Expert parallelism (lesson 09, `lessons/09_experts.ipynb`): the experts of every MoE block of
the course's `MoEGPT` (`dlcourse/moe.py`) are dealt out over the ranks of a group, E/ep each;
every rank sends each token to the ranks holding its experts with an all-to-all of uneven splits
and gets the outputs back with the reverse all-to-all. The EP group is the DP group, or one of
dp/ep groups inside it (`groups.py`): dense weights are replicated and averaged as in lesson 03.

    comm.py         all_to_all (autograd Function: backward is the reverse all-to-all),
                    torch_all_to_all (torch's all_to_all_single_autograd), exchange_counts,
                    GroupCounts (the whole batch's routing counts, for capacity and the aux loss)
    experts.py      ExpertParallelExperts: count exchange, dispatch, local experts (loop or
                    grouped GEMM), combine; sort_by_local_expert, inverse_permutation
    parallelize.py  check_ep, expert_parallel(model, group) / parallel_moe, average_gradients
                    (dense: all-reduce over dp, / dp; experts: all-reduce over the expert-data-
                    parallel group if dp > ep, / dp), full_parameters, expert_parameters
    groups.py       ep_layout, new_expert_groups: EP groups inside data parallelism (dp > ep)
                    and the expert-data-parallel groups that average each expert's copies
    measure.py      count_layer, rows_moved, all_to_all_formula, param_bytes, local_param_bytes
    compare.py      VARIANTS (scratch / torch dispatch x loop / grouped GEMM), time_variants
                    beside one process (`benchmarks/expert.py`); communication_share:
                    an EP step beside its collectives replayed alone
"""

from dlcourse.parallel.expert.comm import (GroupCounts, all_to_all, exchange_counts,
                                           torch_all_to_all)
from dlcourse.parallel.expert.experts import (ALL_TO_ALL, ExpertParallelExperts,
                                              inverse_permutation, sort_by_local_expert)
from dlcourse.parallel.expert.groups import ep_layout, new_expert_groups
from dlcourse.parallel.expert.parallelize import (average_gradients, check_ep, expert_parallel,
                                                  expert_parameters, full_parameters,
                                                  parallel_moe)

__all__ = [
    "GroupCounts", "all_to_all", "exchange_counts", "torch_all_to_all", "ALL_TO_ALL",
    "ExpertParallelExperts", "inverse_permutation", "sort_by_local_expert", "average_gradients",
    "check_ep", "expert_parallel", "expert_parameters", "full_parameters", "parallel_moe",
    "ep_layout", "new_expert_groups",
]
