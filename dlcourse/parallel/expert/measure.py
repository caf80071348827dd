"""What expert parallelism costs, measured beside the formulas (lesson 09).

    count_layer(config, batch, group)    # one MoE layer's collectives, forward and backward
    all_to_all_formula(config, batch, ep)  # k·b·s·h·(ep-1)/ep values leave a rank, each way
    param_bytes(config, ep)              # experts / ep + dense, per rank
    params_per_token(config)             # total parameters against those one token uses
    all_to_all_time(config, batch, ep, alpha, beta)   # lesson 02's alpha-beta model
    tp_mlp_bytes(config, batch, tp)      # what tensor parallelism of the dense MLP would move
    routing_history(config, data, steps) # tokens per expert and drops, step by step (heat maps)

The all-to-alls of one MoE layer, on a rank holding b sequences of s tokens (b·s·k assignments
when dropless). Forward: the dispatch sends this rank's M = k·b·s rows (h values each) and the
combine sends back the R rows it received; backward: the reverse of each, the same sizes the
other way. A row sent to this rank's own experts never leaves it, so the bytes over the link
are (M - own)·h and (R - own)·h. Only when routing is uniform (every rank sends k·b·s/ep rows to
every rank, so M = R = k·b·s) is that k·b·s·h·(ep-1)/ep each way, the formula, and what
`CommCounter`'s bus factor (ep-1)/ep times the tensor size gives; with uneven splits the counter's
`nbytes` (the tensor sent) stays exact but the bus factor is an average. Two small integer
collectives come with each forward: the counts all-to-all (E values) and the all-gather of the
(k, E) counts that makes capacity and the load-balance loss the whole batch's.
"""

import torch
import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.models import MoEGPT, moe_loss
from dlcourse.moe import MoE
from dlcourse.parallel.expert.parallelize import expert_parameters, parallel_moe


def uniform_routing(moe, batch, seq_len, seed=0):
    """Set `moe`'s router to read the first E input dims and make an input (batch, seq_len, h)
    that sends token n to experts n, n+1, .., n+k-1 (mod E): uniform when E divides the tokens."""
    E, k = moe.n_experts, moe.top_k
    h = moe.router.weight.size(1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :E] = torch.eye(E)  # logits = x[:, :E]
    gen = torch.Generator().manual_seed(seed)
    x = 0.1 * torch.randn(batch * seq_len, h, generator=gen)
    n = torch.arange(batch * seq_len)
    x[:, :E] = 0
    for j in range(k):  # choice j gets logit 10·(k - j): a strict order, far above the noise
        x[n, (n + j) % E] = 10.0 * (k - j)
    return x.view(batch, seq_len, h)


def count_layer(config, batch, group, uniform=True, seed=0, device="cpu"):
    """One expert-parallel MoE layer, forward and backward on this rank's (batch, s, h) input,
    routed uniformly (`uniform_routing`) or by a random router on random input: returns
    ({"forward"/"backward": [CommRecord]}, the layer), whose `experts.received` and
    `tokens_per_expert` say where the rows went. `device`: where the layer and its input live
    (drawn on the CPU, so every device gets the same numbers; "cuda" with nccl)."""
    gen = torch.Generator().manual_seed(seed)
    moe = MoE(config)
    for p in moe.parameters():  # the same weights on every rank
        torch.nn.init.normal_(p, std=0.02, generator=gen)
    rank = dist.get_rank(group)
    if uniform:
        x = uniform_routing(moe, batch, config.seq_len, seed + 1 + rank)
    else:
        gen = torch.Generator().manual_seed(seed + 1 + rank)
        x = torch.randn(batch, config.seq_len, config.hidden, generator=gen)
        with torch.no_grad():
            moe.router.weight.mul_(50)  # routing far from uniform: uneven splits
    moe.to(device)
    parallel_moe(moe, group)
    x = x.to(device).requires_grad_()
    with CommCounter() as forward:
        y = moe(x)
    with CommCounter() as backward:
        y.backward(torch.ones_like(y))
    return {"forward": forward.records, "backward": backward.records}, moe


def rows_moved(moe, group):
    """From the last forward of an expert-parallel `moe`: {"dispatch": rows this rank sent,
    "combine": rows it sent back, "own": rows that stayed on this rank}."""
    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    sent = moe.tokens_per_expert.view(ep, -1).sum(dim=1)  # (ep,) rows to each rank
    received = moe.experts.received.sum(dim=1)  # (ep,) rows from each rank
    return {"dispatch": int(sent.sum()), "combine": int(received.sum()), "own": int(sent[rank])}


def all_to_all_formula(config, batch, ep, itemsize=4):
    """Bytes that leave one rank in one all-to-all of an MoE layer under uniform routing:
    k·b·s·h·(ep-1)/ep·itemsize (b sequences of s tokens on this rank)."""
    return config.top_k * batch * config.seq_len * config.hidden * (ep - 1) / ep * itemsize


def param_bytes(config, ep, itemsize=4):
    """{"experts": this rank's E/ep experts of every MoE block, "dense": everything else,
    held whole (routers and shared experts included)}, in bytes. Per expert: the MLP's 2·h·f
    weights (+ f + h biases); n shared experts: one MLP of width n·f."""
    V, T, h, L, f, E = (config.vocab_size, config.seq_len, config.hidden, config.n_layers,
                        config.ffn_hidden, config.n_experts)
    bias = config.bias
    n_moe = len(config.moe_blocks)
    expert = 2 * h * f + (f + h if bias else 0)
    dense_mlp = 2 * h * 4 * h + (4 * h + h if bias else 0)
    block = 4 * h * h + (3 * h + h if bias else 0) + 2 * (2 * h if bias else h)  # attn, 2 LN
    shared = config.n_shared_experts * 2 * h * f + (config.n_shared_experts * f + h
                                                     if bias and config.n_shared_experts else 0)
    dense = V * h + T * h + L * block + (L - n_moe) * dense_mlp + n_moe * (E * h + shared)
    dense += (2 * h if bias else h) + (0 if config.tie_embeddings else V * h)  # ln_f, lm_head
    return {"experts": n_moe * E * expert * itemsize // ep, "dense": dense * itemsize}


def local_param_bytes(model):
    """Bytes of this rank's parameters: {"experts": the sharded ones, "dense": the rest}."""
    experts = {id(p) for p in expert_parameters(model)}
    out = {"experts": 0, "dense": 0}
    for p in model.parameters():
        out["experts" if id(p) in experts else "dense"] += p.numel() * p.element_size()
    return out


def params_per_token(config):
    """{"total": every parameter, "active": those one token's forward uses: the dense ones and
    k of the E experts of each MoE block}. Compute per token follows "active" (about 6 FLOPs per
    active weight in training), memory follows "total": why MoE is cheap per token and costly
    in memory."""
    split = param_bytes(config, 1, itemsize=1)  # one byte per value: counts
    return {"total": split["experts"] + split["dense"],
            "active": split["dense"] + split["experts"] * config.top_k // config.n_experts}


def all_to_all_time(config, batch, ep, alpha, beta, itemsize=4):
    """Seconds of one MoE all-to-all under lesson 02's alpha-beta model, routing uniform: each
    rank sends ep - 1 messages one after another (a direct exchange over one link), together
    k·b·s·h·(ep-1)/ep·itemsize bytes: (ep - 1)·alpha + bytes·beta."""
    return (ep - 1) * alpha + all_to_all_formula(config, batch, ep, itemsize) * beta


def tp_mlp_bytes(config, batch, tp, itemsize=4):
    """Bytes one rank sends for the dense MLP under Megatron TP (lesson 04), forward or
    backward: one ring all-reduce of the b·s·h activations, 2·(tp-1)/tp of them, b the
    sequences this rank holds. Against EP's two all-to-alls each way, 2·k·(ep-1)/ep of its own
    b·s·h: k times as much at tp = ep with the same b on every rank; but a TP group's ranks all
    hold the same sequences, so for one batch over the same ranks TP's b is ep times EP's and
    EP sends k/ep of TP's bytes."""
    return 2 * (tp - 1) / tp * batch * config.seq_len * config.hidden * itemsize


def routing_history(config, data, steps, lr=1e-3, seed=0):
    """Train `MoEGPT(config, seed)` in one process for `steps` AdamW steps on `data` (inputs,
    targets) and record, before each step's update: "tokens" (steps, MoE blocks, E) assignments
    each expert computed, "dropped" (steps, MoE blocks), "aux" and "loss" (steps,). Run it with
    two values of `config.aux_loss_coef` to see what the load-balance loss does to routing."""
    model = MoEGPT(config, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    out = {"tokens": [], "dropped": [], "aux": [], "loss": []}
    for _ in range(steps):
        optimizer.zero_grad()
        loss = moe_loss(model, model(data[0]), data[1])
        loss.backward()
        optimizer.step()
        layers = model.moe_layers()
        out["tokens"].append(torch.stack([m.tokens_per_expert for m in layers]))
        out["dropped"].append(torch.tensor([m.dropped for m in layers]))
        out["aux"].append(model.aux_loss().item())
        out["loss"].append(loss.item())
    return {"tokens": torch.stack(out["tokens"]), "dropped": torch.stack(out["dropped"]),
            "aux": torch.tensor(out["aux"]), "loss": torch.tensor(out["loss"])}
