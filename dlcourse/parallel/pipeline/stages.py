"""Cutting the course GPT into pipeline stages (lesson 06, `lessons/06_pipeline.ipynb`).

Stage 0 holds the embeddings, the last stage the final LayerNorm, the output layer (and the
loss, which the executor computes there), and the blocks are shared out evenly in between:

    bounds = stage_boundaries(n_layers=8, n_stages=3)   # [0, 3, 6, 8]: 3 + 3 + 2 blocks
    stages = cut_stages(GPT(cfg), group, v=1)            # this rank's stage(s), as nn.Modules

A stage keeps the GPT's own parameter names ("blocks.5.attn.qkv.weight"), so the pieces of every
rank put back together are the GPT's state dict. The GPT itself knows nothing of ranks; these
functions take the pipeline group (`group`) and read the rank from it.

Tied embeddings: the GPT uses one (V, h) matrix twice, as the token embedding (stage 0) and as
the output layer (last stage). Cut apart, each end holds a copy, and after backward both copies
must get the sum of the two gradients so that they stay equal (Megatron-LM does the same):
`sync_tied_grads` exchanges them between the two ranks.
"""

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.collectives.p2p import global_rank, rank_in

TIED = ("tok_emb.weight", "lm_head.weight")  # the two names of the GPT's one tied matrix


def stage_boundaries(n_layers, n_stages):
    """[b_0 = 0, ..., b_p = n_layers]: stage s holds blocks b_s .. b_{s+1}-1. Sizes differ by at
    most one, the extra blocks on the first stages (the last one also runs the output layer)."""
    if n_stages > n_layers:
        raise ValueError(f"{n_stages} stages need at least {n_stages} blocks, one each, but the "
                         f"model has n_layers={n_layers}: use fewer stages or more layers")
    size, extra = divmod(n_layers, n_stages)
    bounds = [0]
    for s in range(n_stages):
        bounds.append(bounds[-1] + size + (s < extra))
    return bounds


class Stage(nn.Module):
    """Stage `index` of `n_stages`: consecutive blocks of a GPT, the embeddings if first, the
    final LayerNorm and output layer if last. forward: tokens (b, T) or activations (b, T, h) ->
    activations (b, T, h), or logits (b, T, V) on the last stage."""

    def __init__(self, gpt, index, n_stages):
        super().__init__()
        bounds = stage_boundaries(gpt.config.n_layers, n_stages)
        self.index, self.n_stages = index, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.hidden = gpt.config.hidden  # h: the width of the activations it sends and receives
        self.tied = gpt.config.tie_embeddings  # last stage's lm_head.weight is tok_emb.weight
        if self.is_first:
            self.tok_emb, self.pos_emb = copy.deepcopy(gpt.tok_emb), copy.deepcopy(gpt.pos_emb)
        self.blocks = nn.ModuleDict({str(i): copy.deepcopy(gpt.blocks[i])  # keys: GPT's indices
                                     for i in range(bounds[index], bounds[index + 1])})
        if self.is_last:
            self.ln_f, self.lm_head = copy.deepcopy(gpt.ln_f), copy.deepcopy(gpt.lm_head)
            if self.is_first and gpt.config.tie_embeddings:  # one stage holds both ends
                self.lm_head.weight = self.tok_emb.weight

    def forward(self, x):
        if self.is_first:
            T = x.shape[1]  # x: (b, T) token ids
            x = self.tok_emb(x) + self.pos_emb(torch.arange(T, device=x.device))  # (b, T, h)
        for block in self.blocks.values():
            x = block(x)
        if self.is_last:
            x = self.lm_head(self.ln_f(x))  # (b, T, V)
        return x


def cut_stages(gpt, group=None, v=1, style="loop"):
    """This rank's stages of `gpt`, cut into p * v stages (p = the group's size): stage
    chunk * p + rank for chunk 0 .. v-1 (v > 1: the interleaved schedule's virtual stages).
    style="v" (v = 2, zero bubble's ZBV and DualPipeV): stages rank and 2p - 1 - rank, so that
    rank 0 holds the first and the last stage."""
    rank, p = rank_in(group, "cut_stages")
    n_stages = p * v
    stage_boundaries(gpt.config.n_layers, n_stages)  # the error, if there are too few blocks
    if style == "v":
        if v != 2:
            raise ValueError(f"style='v' deals 2 stages per rank (down, then back up); got v={v}")
        return [Stage(gpt, rank, n_stages), Stage(gpt, n_stages - 1 - rank, n_stages)]
    return [Stage(gpt, chunk * p + rank, n_stages) for chunk in range(v)]


def tied_ends(stages):
    """(first stage's tok_emb.weight or None, last stage's lm_head.weight or None) on this rank."""
    first = next((s.tok_emb.weight for s in stages if s.is_first), None)
    last = next((s.lm_head.weight for s in stages if s.is_last), None)
    return first, last


def sync_tied_grads(stages, group=None):
    """Give both copies of the tied embedding the sum of their gradients: the gradient the one
    matrix gets in the uncut GPT. A send/recv pair between the first and the last stage's rank;
    a no-op on every other rank, or where one rank holds both ends."""
    first, last = tied_ends(stages)
    if not stages[0].tied or (first is None and last is None):
        return
    if first is not None and last is not None:
        if first is not last:
            total = first.grad + last.grad
            first.grad.copy_(total), last.grad.copy_(total)
        return
    _, p = rank_in(group, "sync_tied_grads")
    mine = first if first is not None else last
    peer = global_rank(group, (stages[0].n_stages - 1) % p if first is not None else 0)
    theirs = torch.empty_like(mine.grad)
    ops = [dist.P2POp(dist.isend, mine.grad, peer, group),
           dist.P2POp(dist.irecv, theirs, peer, group)]  # both posted before either waits
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    mine.grad.add_(theirs)


def gather_params(stages, group=None):
    """name -> full tensor (CPU copy) of every GPT parameter, on every rank of the group: each
    rank's stages' parameters put together (the tied matrix once, as tok_emb.weight)."""
    mine = {name: p.detach().to("cpu", copy=True) for s in stages
            for name, p in s.named_parameters() if name != "lm_head.weight" or not s.tied}
    pieces = [None] * dist.get_world_size(group)
    dist.all_gather_object(pieces, mine, group=group)
    return {k: v for piece in pieces for k, v in piece.items()}
