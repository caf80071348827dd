"""Make the course GPT context-parallel for a process group (lesson 08,
`lessons/08_context_parallel.ipynb`).

    check_cp(config, cp, "zigzag")                 # before any process starts
    layout = cp_layout(config, group, "zigzag")
    cp_model = context_parallel(GPT(config), group, "zigzag")
    x, y = (layout.shard(t, dist.get_rank(group)) for t in (inputs, targets))  # (B, s/cp)
    lm_loss(cp_model(x), y).backward()             # this rank's s/cp tokens
    average_gradients(cp_model, group)             # the weights are replicated, as in DP

Every rank holds the whole model and s/cp tokens of every sequence. Only two parts of the GPT
care where a token sits in the sequence, and only they change (in a copy; the plain model is
left as it was): attention, which needs every earlier token and whose core becomes one of
`METHODS`, and the learned positions, which must be the tokens' global positions, not
0..s/cp-1. The model's own forward is untouched and knows nothing of ranks. Each rank's loss is the mean over its tokens; all ranks hold as many tokens, so the
mean of the ranks' losses is the whole sequence's loss, and averaging the gradients over the
group gives its gradient (the K/V gradients already crossed the ranks inside attention).
"""

import copy

import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.parallel.context.allgather import allgather_attention
from dlcourse.parallel.context.layout import Layout
from dlcourse.parallel.context.ring import ring_attention
from dlcourse.parallel.context.ulysses import check_ulysses, ulysses_attention

# method -> (how the tokens are laid out over the ranks, attention of local q, k, v)
METHODS = {
    "ring": ("contiguous", ring_attention),
    "zigzag": ("zigzag", ring_attention),
    "ulysses": ("contiguous", ulysses_attention),
    "allgather": ("contiguous", allgather_attention),
}


def check_cp(config, cp, method="ring", seq_len=None):
    """Refuse what cannot be split, with the arithmetic, before any process starts: a sequence
    the layout's chunks do not divide (cp, or 2·cp for zig-zag), heads Ulysses cannot split."""
    if method not in METHODS:
        raise ValueError(f"unknown context-parallel method {method!r}; one of {sorted(METHODS)}")
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a whole number of ranks >= 1, got {cp!r}")
    Layout(METHODS[method][0], cp, seq_len or config.seq_len)  # raises with the arithmetic
    if method == "ulysses":
        check_ulysses(config.n_heads, cp)
    if config.dropout:
        raise ValueError(f"context parallel here needs dropout 0, got {config.dropout}: the "
                         "blockwise attention has no dropout on its probabilities")


def cp_layout(config, group, method="ring", seq_len=None):
    """The `Layout` of `method` for this group: which tokens each rank holds."""
    return Layout(METHODS[method][0], dist.get_world_size(group), seq_len or config.seq_len)


class ContextParallelAttention(nn.Module):
    """`CausalSelfAttention` on this rank's s/cp tokens: its own qkv and proj (the same
    parameters), and the attention core of a context-parallel method in between."""

    def __init__(self, attn, group, layout, attention):
        super().__init__()
        self.n_heads, self.qkv, self.proj = attn.n_heads, attn.qkv, attn.proj
        self.resid_dropout = attn.resid_dropout
        self.group, self.layout, self.attention = group, layout, attention

    def forward(self, x):
        B, n, _ = x.shape  # n = s/cp tokens of this rank
        if n * self.layout.cp != self.layout.seq_len:
            raise ValueError(f"this rank holds {n} tokens; the layout needs s/cp = "
                             f"{self.layout.seq_len} / {self.layout.cp}")
        # each (B, n, h); under lesson 04's TP (B, n, h/tp), this rank's a/tp heads (lesson 07)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = (t.view(B, n, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        y = self.attention(q, k, v, self.group, self.layout, causal=True)  # (B, a, n, hs)
        y = y.transpose(1, 2).reshape(B, n, -1)  # heads side by side again
        return self.resid_dropout(self.proj(y))


class GlobalPositions(nn.Module):
    """The position embedding, looked up at this rank's global positions: the GPT asks for
    positions 0..n-1 of its n local tokens, and gets those of the tokens it really holds."""

    def __init__(self, pos_emb, positions):
        super().__init__()
        self.weight = pos_emb.weight  # (s, h), the same parameter
        # (n,) global. Not a buffer: data-parallel wrappers copy the buffers of the group's
        # first rank to the others (DDP; lesson 05's ZeRO), and over dp x cp ranks that would
        # hand every cp rank the first one's positions (lesson 07's ZeRO x CP measured it).
        self.positions = positions

    def forward(self, local):
        return F.embedding(self.positions.to(local.device)[local], self.weight)  # (n, h)


def cp_block(block, group, layout, method):
    """One `Block` with its attention made context-parallel, in place; returns it."""
    block.attn = ContextParallelAttention(block.attn, group, layout, METHODS[method][1])
    return block


def context_parallel(model, group, method="ring", seq_len=None):
    """A copy of the plain `GPT` that runs on this rank's s/cp tokens of `group`'s sequences."""
    return cp_model(copy.deepcopy(model), group, method, seq_len)


def cp_model(model, group, method="ring", seq_len=None):
    """`context_parallel` in place: `model` itself, changed and returned. For a model that holds
    process groups and cannot be copied: lesson 04's `TensorParallelGPT`, whose a/tp heads per
    rank then split their sequence over `group` (lesson 07's CP x TP grid)."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    check_cp(model.config, cp, method, seq_len)
    layout = cp_layout(model.config, group, method, seq_len)
    model.pos_emb = GlobalPositions(model.pos_emb, layout.positions(rank))
    for block in model.blocks:
        cp_block(block, group, layout, method)
    return model


def average_gradients(model, group):
    """Average every gradient over the group (one all-reduce per parameter): each rank's
    gradient is that of its own tokens' mean loss; the average is the whole sequence's."""
    cp = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(cp)
