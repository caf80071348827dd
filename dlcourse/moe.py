"""The mixture-of-experts layer of the course GPT (lesson 09, `lessons/09_experts.ipynb`).

Plain single-process PyTorch, like `models.py`, which builds `MoEGPT` from it. Each token's
router picks k of E expert MLPs; the token goes only to those, and their outputs are summed with
the router's weights (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch Transformer,
Fedus et al. 2021). One forward, N tokens of width h:

    router_logits    the router in float32 at least, whatever the model's dtype
    route            router logits (N, E) -> probs (N, E), top-k weights renormalised over the
                     k chosen (N, k), expert ids (N, k); softmax (Switch, Mixtral) or sigmoid
                     scores (DeepSeek-V3)
    slot_counts      (k, E): how many tokens chose expert e as their j-th choice
    keep_mask        capacity (optional): which (token, choice) assignments an expert accepts
    permute          the kept assignments sorted by expert, stably: (M,) indices, counts (E,)
    Experts          E MLPs as stacked weights, run on the sorted tokens: a loop over experts,
                     or one grouped GEMM (`F.grouped_mm`: float32, bf16, fp16; no float64) on
                     the groups as routing makes them, empty ones too (`moe_experts.py`)
    combine          the expert outputs, times their weights, added back at their tokens
    load_balance_loss  Switch's auxiliary loss E · Σ_e f_e · P_e
    router_z_loss    ST-MoE's z-loss: the mean over tokens of (log Σ_e exp(logit_e))²
    SharedExperts    DeepSeekMoE's shared experts: MLPs every token goes through, weight 1
                     (`moe_experts.py`)
    fine_grained     DeepSeekMoE's fine-grained split of a config: m·E experts of width f/m,
                     top m·k: the same parameters and FLOPs, many more expert combinations

Two hooks make it expert-parallel without the layer knowing of ranks: `MoE.batch_counts` turns
this process's counts into the whole batch's (one process: they are the same), and `MoE.experts`
may be replaced by a module with the same interface that sends the tokens to other ranks
(`dlcourse.parallel.expert`).

The capacity rule (when `capacity_factor` is set), stated so that it does not depend on how the
batch is split over ranks: expert e accepts at most C = ceil(capacity_factor · k · N / E)
assignments, N the tokens of the *whole* batch. Its queue is ordered by choice first (every
token's first choice before any second choice, as GShard's Algorithm 1 fills top-1 before top-2),
then by the token's index in the whole batch (rank r's tokens come after those of ranks < r, as
`shard_batch` splits the batch in rank order). An assignment is dropped if its place in the queue
is C or more; the token then gets nothing from that expert (the residual carries it on). Its
place needs only counts: same-choice assignments to e on earlier tokens of this process, on
earlier ranks, and all assignments to e of earlier choices. GShard instead gives each group of
tokens (a device's share) its own capacity, which is cheaper, but what it drops then depends on
how the batch is split.
"""

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.moe_experts import Experts, SharedExperts


def router_logits(router, x):
    """x (N, h) -> logits (N, E) computed in float32, or in x's dtype if wider. Switch (Fedus et
    al. 2021, §2.4, "selective precision") casts the router's input to float32 in a bfloat16
    model. bf16 keeps 8 significant bits: a logit near 10 is off by up to 0.03 (half its step
    of 1/16 there), which exp turns into a 3% change of its probability and can flip a top-k
    choice. torchtitan's router also computes its gate in float32 (TokenChoiceTopKRouter,
    torchtitan/models/common/moe.py at b5bcd76)."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return F.linear(x.to(dtype), router.weight.to(dtype))


def route(logits, k, score="softmax"):
    """Router logits (N, E) -> probs (N, E), weights (N, k) renormalised to sum to 1 over the k
    chosen, experts (N, k) int64, slot 0 the most likely.
    softmax: probs = softmax(logits); the weights are Mixtral's softmax over the top-k logits
      (GShard's top-2 too). With k = 1 the weight is p/p = 1, so the language-model loss sends
      the router no gradient through it (Switch multiplies by p itself): a top-1 router here
      learns from the load-balance loss only.
    sigmoid: DeepSeek-V3 (2024, §2.1.2, eq. 13-15): each expert's score s_e = sigmoid(logit_e),
      on its own (eq. 15); the top-k scores normalised to sum to 1 (eq. 13-14; DeepSeek's
      released Gate then scales them by route_scale, 2.5 for V3, which is left out here).
      probs = s / Σ_e s_e, the normalised scores its balance loss averages (eq. 19-20)."""
    if score == "softmax":
        scores = probs = F.softmax(logits, dim=-1)  # (N, E)
    elif score == "sigmoid":
        scores = torch.sigmoid(logits)  # (N, E), each in (0, 1), not summing to 1
        probs = scores / scores.sum(dim=-1, keepdim=True)
    else:
        raise ValueError(f"unknown router score {score!r}: 'softmax' or 'sigmoid'")
    top, experts = scores.topk(k, dim=-1)  # (N, k) each, descending
    return probs, top / top.sum(dim=-1, keepdim=True), experts


def slot_counts(experts, n_experts):
    """(N, k) expert ids -> (k, E): how many tokens chose expert e as their j-th choice."""
    return F.one_hot(experts, n_experts).sum(dim=0)


def one_process_counts(counts):
    """The whole batch's counts and those of earlier ranks, from this process's (k, E) counts:
    one process holds the whole batch, so they are its own, and no rank comes before it."""
    return counts, torch.zeros_like(counts)


def capacity(capacity_factor, n_tokens, k, n_experts):
    """Assignments one expert accepts: ceil(capacity_factor · k · N / E) (Switch eq. 3, with k)."""
    return math.ceil(capacity_factor * k * n_tokens / n_experts)


def keep_mask(experts, counts_before, batch_counts, cap):
    """(N, k) bool: True where expert experts[n, j] accepts token n's j-th choice.

    counts_before (k, E): same-choice assignments of earlier ranks; batch_counts (k, E): the
    whole batch's. Place in e's queue = assignments of earlier choices + same choice on earlier
    ranks + same choice on earlier tokens here (module docstring); kept iff place < cap."""
    n_experts = batch_counts.size(1)
    onehot = F.one_hot(experts, n_experts)  # (N, k, E)
    earlier_tokens = onehot.cumsum(dim=0) - onehot  # (N, k, E), exclusive running count
    earlier_choices = batch_counts.cumsum(dim=0) - batch_counts  # (k, E)
    place = earlier_tokens + counts_before + earlier_choices  # (N, k, E)
    return place.gather(2, experts.unsqueeze(-1)).squeeze(-1) < cap  # (N, k)


def permute(experts, keep, n_experts):
    """The kept assignments sorted by expert: order (M,) indexes the flat (N·k) assignments
    (assignment n·k + j is token n's j-th choice), counts (E,) per expert. The sort is stable,
    so each expert sees its tokens in (token, choice) order."""
    flat = experts.flatten()  # (N·k,)
    kept = keep.flatten().nonzero().squeeze(1)  # (M,) in (token, choice) order
    order = kept[torch.sort(flat[kept], stable=True).indices]  # (M,) grouped by expert
    return order, torch.bincount(flat[kept], minlength=n_experts)


def combine(y, weights, tokens, n_tokens):
    """Expert outputs y (M, h) in sorted order, their router weights (M,), their tokens (M,)
    -> (N, h): each token's weighted sum over its kept experts; zeros where none was kept."""
    out = y.new_zeros(n_tokens, y.size(1))
    return out.index_add(0, tokens, y * weights.unsqueeze(1))


def load_balance_loss(probs, batch_counts):
    """Switch Transformer's auxiliary loss (Fedus et al. 2021, eq. 4-6) with top-k:
    E · Σ_e f_e · P_e, 1 when routing is uniform. f_e = share of the batch's k·N assignments that
    chose e (from the router's choices before any drop; counts carry no gradient; for k = 1 it
    is Switch's fraction of tokens), P_e = mean router probability of e over this process's
    tokens. probs (N, E), batch_counts (E,) over the whole batch."""
    n_experts = probs.size(1)
    f = batch_counts.to(probs.dtype) / batch_counts.sum()  # (E,), sums to 1
    return n_experts * (f * probs.mean(dim=0)).sum()


def router_z_loss(logits):
    """ST-MoE's router z-loss (Zoph et al. 2022): (1/N) Σ_n (log Σ_e exp(logits[n, e]))², as
    Hugging Face's router_z_loss_func (switch_transformers) and Google's TF Model Garden
    _router_z_loss compute it. It keeps the logits small, where the exponent's rounding errors
    are small; Hugging Face's Switch config weights it 1e-3 (`MoEConfig.z_loss_coef`). A mean
    over this process's tokens, like P_e."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def fine_grained(config, m):
    """DeepSeekMoE's fine-grained experts (Dai et al. 2024, §3.1): each expert cut into m along
    its inner width, m·E experts of width f/m, m·k of them a token, and m·n shared ones (the
    paper counts shared experts in fine-grained units, §3.2): the same expert weight matrices
    and FLOPs; the router grows to m·E·h, and with biases each new expert has its own."""
    if config.ffn_hidden % m:
        raise ValueError(f"fine_grained: m = {m} does not divide the expert width "
                         f"{config.ffn_hidden} ({config.ffn_hidden} / {m} = "
                         f"{config.ffn_hidden / m:g})")
    return dataclasses.replace(config, n_experts=m * config.n_experts, top_k=m * config.top_k,
                               expert_hidden=config.ffn_hidden // m,
                               n_shared_experts=m * config.n_shared_experts)


class MoE(nn.Module):
    """The MoE MLP of a block: (B, T, h) -> (B, T, h). After each forward it holds `aux_loss`
    (this forward's load-balance loss), `z_loss` (its router z-loss), `tokens_per_expert` (E,)
    kept assignments this process sent to each expert, and `dropped`: assignments over
    capacity. With `config.n_shared_experts` > 0, `shared` adds DeepSeekMoE's shared experts."""

    def __init__(self, config):
        super().__init__()
        self.n_experts, self.top_k = config.n_experts, config.top_k
        self.capacity_factor, self.score = config.capacity_factor, config.score_func
        self.router = nn.Linear(config.hidden, config.n_experts, bias=False)
        self.experts = Experts(config.n_experts, config.hidden, config.ffn_hidden, config.bias)
        self.shared = (SharedExperts(config.n_shared_experts, config.hidden, config.ffn_hidden,
                                     config.bias) if config.n_shared_experts else None)
        self.dropout = nn.Dropout(config.dropout)
        self.batch_counts = one_process_counts  # replaced by expert parallelism
        self.aux_loss = self.z_loss = self.tokens_per_expert = self.dropped = None

    def forward(self, x):
        B, T, h = x.shape
        x = x.reshape(B * T, h)  # (N, h): every token on its own
        logits = router_logits(self.router, x)  # (N, E), float32 at least
        probs, weights, experts = route(logits, self.top_k, self.score)  # (N, E), (N, k) x 2
        batch, before = self.batch_counts(slot_counts(experts, self.n_experts))  # (k, E) each
        self.aux_loss, self.z_loss = load_balance_loss(probs, batch.sum(0)), router_z_loss(logits)
        keep = self._keep(experts, before, batch)  # (N, k)
        order, counts = permute(experts, keep, self.n_experts)  # (M,), (E,)
        tokens = order // self.top_k  # (M,) the token of each sorted assignment
        y = self.experts(x[tokens], counts)  # (M, h), sorted by expert
        out = combine(y, weights.flatten()[order].to(y.dtype), tokens, B * T)  # (N, h)
        if self.shared is not None:
            out = out + self.shared(x)
        self.tokens_per_expert, self.dropped = counts, int((~keep).sum())
        return self.dropout(out.view(B, T, h))

    def _keep(self, experts, before, batch):
        if self.capacity_factor is None:  # dropless: every assignment is computed
            return torch.ones_like(experts, dtype=torch.bool)
        n_tokens = int(batch.sum()) // self.top_k  # the whole batch's tokens
        cap = capacity(self.capacity_factor, n_tokens, self.top_k, self.n_experts)
        return keep_mask(experts, before, batch, cap)
