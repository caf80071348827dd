"""The references lesson 09's checks compare with (`dlcourse/checks/expert/`), written apart from
the lesson's code (`dlcourse/moe.py`, `dlcourse/parallel/expert/`): plain single-process torch in
float64, token by token where that is clearer than fast. They are refused while a student's code
runs (`answers.py`), like the lesson's own answers.

    routed(logits, k, capacity)          experts (N, k), weights (N, k), keep (N, k)
    switch_loss(logits, k)               E · Σ_e f_e · P_e and its gradient w.r.t. the logits
    dispatched(xs, experts, E, dest)     the rows rank `dest` receives, and its (ep, E/ep) counts
    by_destination(experts, E)           the (N·k,) assignments grouped by expert, stably
    unpermuted(y, order, weights)        (N, h): each token's k outputs back, mixed by weight
    layer_counts(h, f, E, k, bias)       total and active parameters, forward FLOPs per token
"""

import torch


def routed(logits, k, capacity=None):
    """Softmax over each token's E logits, its k most likely experts (most likely first), their
    probabilities renormalised to sum to 1; keep[n, j]: expert experts[n, j] takes token n's j-th
    choice. Each expert's queue: every token's first choice (in token order), then every second
    choice, ...; the first `capacity` in it are kept (all with capacity None)."""
    probs = torch.softmax(logits.to(torch.float64), dim=1)  # (N, E)
    n_tokens, n_experts = probs.shape
    order = torch.sort(probs, dim=1, descending=True, stable=True).indices[:, :k]  # (N, k)
    chosen = probs.gather(1, order)
    weights = chosen / chosen.sum(dim=1, keepdim=True)
    keep = torch.ones(n_tokens, k, dtype=torch.bool)
    if capacity is not None:
        taken = [0] * n_experts  # assignments each expert accepted so far
        for j in range(k):  # choice first ...
            for n in range(n_tokens):  # ... then the token's place in the batch
                e = int(order[n, j])
                keep[n, j] = taken[e] < capacity
                taken[e] += 1  # a dropped assignment still holds its place in the queue
    return order, weights, keep


def switch_loss(logits, k):
    """Switch Transformer's load-balance loss with top-k (Fedus et al. 2021, eq. 4-6):
    E · Σ_e f_e · P_e, f_e the share of the N·k assignments that chose e (a count: no gradient),
    P_e the mean router probability of e over the N tokens. Returns (loss, d loss / d logits),
    in float64."""
    logits = logits.detach().to(torch.float64).requires_grad_()
    probs = torch.softmax(logits, dim=1)
    n_tokens, n_experts = probs.shape
    chosen = torch.sort(probs.detach(), dim=1, descending=True, stable=True).indices[:, :k]
    counts = torch.zeros(n_experts, dtype=torch.float64)
    for e in chosen.flatten().tolist():
        counts[e] += 1
    f = counts / (n_tokens * k)
    P = probs.sum(dim=0) / n_tokens
    loss = n_experts * (f * P).sum()
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.detach(), grad


def dispatched(xs, experts, n_experts, dest):
    """What rank `dest` receives when every rank s sends each of its rows xs[s][i] to the rank
    holding expert experts[s][i] (rank r holds experts r·E/ep .. (r+1)·E/ep - 1): rows by source
    rank, then local expert, then their order on the source; and counts (ep, E/ep), row s = what
    rank s sent to each of `dest`'s experts."""
    ep = len(xs)
    n_local = n_experts // ep
    rows, counts = [], torch.zeros(ep, n_local, dtype=torch.int64)
    for s in range(ep):
        for j in range(n_local):
            e = dest * n_local + j
            for i in range(xs[s].size(0)):
                if int(experts[s][i]) == e:
                    rows.append(xs[s][i])
                    counts[s, j] += 1
    width = xs[0].size(1)
    out = torch.stack(rows) if rows else torch.empty(0, width, dtype=xs[0].dtype)
    return out, counts


def by_destination(experts, n_experts):
    """experts (N, k) -> (N·k,) int64: the flat assignments (n·k + j is token n's j-th choice)
    expert by expert, 0 first, each expert's in (token, choice) order: bucket by bucket."""
    flat = experts.flatten().tolist()
    buckets = [[] for _ in range(n_experts)]
    for a, e in enumerate(flat):
        buckets[e].append(a)
    return torch.tensor([a for bucket in buckets for a in bucket], dtype=torch.int64)


def unpermuted(y, order, weights):
    """y (N·k, h) float64, row i the output for assignment order[i]; weights (N, k) -> (N, h):
    out[n] = Σ_j weights[n, j] · (the output of assignment n·k + j), token by token."""
    n_tokens, k = weights.shape
    row_of = {int(a): i for i, a in enumerate(order)}  # assignment -> its row of y
    out = torch.zeros(n_tokens, y.size(1), dtype=torch.float64)
    for n in range(n_tokens):
        for j in range(k):
            out[n] += weights[n, j].double() * y[row_of[n * k + j]].double()
    return out


def layer_counts(hidden, expert_hidden, n_experts, top_k, bias):
    """One MoE layer built from torch.nn on the meta device (no memory) and counted: a router
    Linear(h, E) without bias and E expert MLPs Linear(h, f), Linear(f, h). Returns (total
    parameters, active: router + k experts, forward FLOPs per token: 2 per weight of the
    matrices the token is multiplied by, router and k experts; biases and GELU not counted)."""
    meta = {"device": "meta"}
    router = torch.nn.Linear(hidden, n_experts, bias=False, **meta)
    expert = torch.nn.Sequential(torch.nn.Linear(hidden, expert_hidden, bias=bias, **meta),
                                 torch.nn.Linear(expert_hidden, hidden, bias=bias, **meta))
    n_router = sum(p.numel() for p in router.parameters())
    n_expert = sum(p.numel() for p in expert.parameters())
    matrices = sum(m.weight.numel() for m in expert)  # one expert's two weight matrices
    return (n_router + n_experts * n_expert, n_router + top_k * n_expert,
            2 * (n_router + top_k * matrices))
