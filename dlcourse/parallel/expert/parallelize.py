"""Make the MoE GPT expert-parallel over a process group (lesson 09, `lessons/09_experts.ipynb`).

    check_ep(config, ep)                          # before any process starts
    ep_model = expert_parallel(MoEGPT(config), group)
    x, y = shard_batch((inputs, targets), group)  # lesson 03: this rank's b of the B sequences
    moe_loss(ep_model, ep_model(x), y).backward()
    average_gradients(ep_model, group)            # dense averaged, experts divided by ep
    full_parameters(ep_model, group)              # {name: whole tensor}, for the proofs

With more data-parallel ranks than ep (`groups.py`): expert_parallel(model, ep_group,
batch_group=dp_group), and average_gradients(model, ep_group, dp_group, edp_group).

The usual layout: the EP group is the DP group. Every rank holds the dense weights whole (as in
data parallelism) and E/ep experts, and routes its own tokens to every rank's experts.

The gradients. One process trains on the mean loss over the batch, L = (1/ep) Σ_r L_r, with L_r
the mean over rank r's equal shard (`shard_batch`), load-balance loss included (`moe.py`: its f
counts the whole batch, its P is the mean over rank r's tokens, so the mean of the ranks' aux
losses is the one-process one). Each rank's backward gives ∇L_r.
  dense parameters: rank r holds ∇L_r; the one-process gradient is their mean: all-reduce, / ep
  (lesson 03).
  expert parameters: the reverse all-to-all brings every rank's ∂L_r/∂(its rows) back to the
  expert's owner, so its gradient already sums over ranks: Σ_r ∇_e L_r. The one-process gradient
  is (1/ep) of that: divide by ep, no all-reduce (there is nothing to add: no other rank holds
  this expert). An all-reduce here would add other experts' gradients; forgetting / ep leaves
  them ep times too large.
"""

import copy

import torch
import torch.distributed as dist

from dlcourse.parallel.expert.comm import GroupCounts
from dlcourse.parallel.expert.experts import ALL_TO_ALL, ExpertParallelExperts


def check_ep(config, ep, all_to_all="scratch", grouped_mm=False):
    """Refuse what cannot be split or run, with the arithmetic, before any process starts."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ValueError(f"ep must be a whole number of ranks >= 1, got {ep!r}")
    if config.n_experts % ep:
        raise ValueError(f"ep {ep} does not divide n_experts {config.n_experts} "
                         f"({config.n_experts} / {ep} = {config.n_experts / ep:g}); every rank "
                         f"holds E/ep whole experts: use n_experts a multiple of {ep}")
    if all_to_all not in ALL_TO_ALL:
        raise ValueError(f"unknown all_to_all {all_to_all!r}; one of {sorted(ALL_TO_ALL)}")
    if grouped_mm:
        check_grouped_mm(config)


def check_grouped_mm(config):
    """torch's grouped GEMM needs rows of 16 bytes' multiple: widths that are multiples of 8
    suit float32, bfloat16 and float16 alike (it takes no float64: the model must be in one)."""
    if not (hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")):
        raise ValueError(f"torch {torch.__version__} has no grouped GEMM; use grouped_mm=False")
    for name, width in (("hidden", config.hidden), ("expert width", config.ffn_hidden)):
        if width % 8:
            raise ValueError(f"grouped_mm needs rows of a multiple of 16 bytes: {name} {width} "
                             f"is not a multiple of 8 ({width} / 8 = {width / 8:g}); use the "
                             "loop (grouped_mm=False) or a width that is")


def expert_parallel(model, group, all_to_all="scratch", grouped_mm=False, batch_group=None):
    """A copy of the `MoEGPT` holding this rank's E/ep experts of every MoE block (`group`: the
    EP group) and the dense weights whole; its MoE blocks count routing (capacity, load-balance
    loss) over the batch of `batch_group`, the ranks that split one batch (default: `group`)."""
    check_ep(model.config, dist.get_world_size(group), all_to_all, grouped_mm)
    model = copy.deepcopy(model)
    for moe in model.moe_layers():
        parallel_moe(moe, group, all_to_all, grouped_mm, batch_group)
    return model


def parallel_moe(moe, group, all_to_all="scratch", grouped_mm=False, batch_group=None):
    """One `MoE` made expert-parallel in place: its experts cut to this rank's block of the EP
    `group`, its routing counted over `batch_group`'s batch (default: `group`). Returns it."""
    moe.experts = ExpertParallelExperts(moe.experts, group, all_to_all, grouped_mm)
    moe.batch_counts = GroupCounts(batch_group or group)
    return moe


def expert_parameters(model):
    """The parameters that are sharded over the group: those of the expert-parallel experts."""
    return [p for m in model.modules() if isinstance(m, ExpertParallelExperts)
            for p in m.parameters()]


def average_gradients(model, group, dp_group=None, edp_group=None):
    """After backward: the one-process gradient of the whole batch's mean loss (module
    docstring). Dense: all-reduce over the data-parallel ranks (`dp_group`, default the EP
    `group`), / dp; experts: all-reduce over the expert-data-parallel group when there is one
    (dp > ep: `groups.py`), / dp."""
    dp_group = dp_group or group
    dp = dist.get_world_size(dp_group)
    experts = {id(p) for p in expert_parameters(model)}
    for p in model.parameters():
        if p.grad is None:
            continue
        if id(p) not in experts:
            dist.all_reduce(p.grad, group=dp_group)
        elif edp_group is not None:
            dist.all_reduce(p.grad, group=edp_group)  # the other EP groups' share
        p.grad.div_(dp)


def full_parameters(model, group, grads=False):
    """{name: whole tensor}: expert weights (or with grads=True their gradients) all-gathered
    along the expert dim, dense ones as this rank holds them."""
    ep = dist.get_world_size(group)
    experts = {id(p) for p in expert_parameters(model)}
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach()
        if id(p) in experts:
            pieces = [torch.empty_like(t) for _ in range(ep)]
            dist.all_gather(pieces, t.contiguous(), group=group)
            t = torch.cat(pieces)
        out[name] = t
    return out
