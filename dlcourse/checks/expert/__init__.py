"""Checks for lesson 09's exercises (`exercises/09_experts.ipynb`): mixture of experts and
expert parallelism by hand.

    check_route_with_capacity(route_with_capacity)   top-k, renormalised weights, capacity queue
    check_load_balance_loss(load_balance_loss)       Switch's E · Σ f_e · P_e, value and gradient
    check_dispatch_to_experts(dispatch_to_experts)   counts and rows by all-to-all, real ranks
    check_moe_layer_counts(moe_layer_counts)         total vs active parameters, FLOPs per token
    check_a2a_bytes_per_layer(a2a_bytes_per_layer)   all-to-all bytes per rank, forward/backward
    check_permutation(permute_by_destination, unpermute)
                                                     the stable sort by destination, its inverse

    route_with_capacity.py  top-k and the capacity queue, a formula called here
    load_balance_loss.py    Switch's auxiliary loss and its gradient, called here
    cases.py      the router logits those two draw
    dispatch_to_experts.py  the dispatch, on 2, 3 and 4 gloo ranks, bytes counted
    moe_layer_counts.py     the layer's parameters and FLOPs
    a2a_bytes_per_layer.py  the all-to-all bytes, against the lesson's formula
    permutation.py  the permutation by destination and its inverse, top-k combined by weight
    reference.py  the independent references (plain torch, float64)
    answers.py    what is refused while a student's code runs

Every check draws its cases afresh on each run and names the seed with a failure; `seed=`
draws the same cases again.
"""

from dlcourse.checks.expert.a2a_bytes_per_layer import check_a2a_bytes_per_layer
from dlcourse.checks.expert.dispatch_to_experts import check_dispatch_to_experts
from dlcourse.checks.expert.load_balance_loss import check_load_balance_loss
from dlcourse.checks.expert.moe_layer_counts import check_moe_layer_counts
from dlcourse.checks.expert.permutation import check_permutation
from dlcourse.checks.expert.route_with_capacity import check_route_with_capacity

__all__ = ["check_route_with_capacity", "check_load_balance_loss", "check_dispatch_to_experts",
           "check_moe_layer_counts", "check_a2a_bytes_per_layer", "check_permutation"]
