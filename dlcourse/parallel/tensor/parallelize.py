"""Make the course GPT tensor-parallel for a process group (lesson 04,
`lessons/04_tensor_parallel.ipynb`).

    check_tp(config, tp, sequence_parallel)        # before any process starts
    tp_model = parallelize(GPT(config), group, sequence_parallel=False)
    loss = vocab_parallel_lm_loss(tp_model(x), y, group)
    full_parameters(tp_model, group)               # {name: whole tensor}, for the proofs

`parallelize` follows `PLAN`, a table from each module of a block to what it becomes. The plain
model is not changed: the new model holds this rank's shards, and its blocks are the model's own
`Block` and `MLPBlock` (their forward is unchanged) with their layers swapped. Only attention gets
a forward of its own: it must know it holds n_heads/t heads. Parameter names stay the plain
model's, so the proofs compare name by name.
"""

import copy
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.parallel.grid import RankGrid
from dlcourse.parallel.tensor.dropout import track_dropout
from dlcourse.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                             SequenceParallelLayerNorm, SequenceParallelPositions,
                                             VocabParallelEmbedding, unshard)

# What each module of a Block becomes (Megatron's pairing: column, then row, one g between).
# "qkv" is column-parallel cut per q, k and v (3 parts); the LayerNorms only change with
# sequence parallelism, where they run on sequence shards.
PLAN = {
    "attn.qkv": ("column", {"parts": 3}),
    "attn.proj": ("row", {}),
    "mlp.fc": ("column", {}),
    "mlp.proj": ("row", {}),
    "ln1": ("sequence_norm", {}),
    "ln2": ("sequence_norm", {}),
}


def check_tp(config, tp, sequence_parallel=False, tracked=False):
    """Refuse a tp size the course GPT cannot be cut into, with the arithmetic in the message;
    and dropout without a tracker (`tracked`: `parallelize` got one) or with sequence parallel."""
    RankGrid(tp=tp).check_model(config)
    if config.dropout and tp > 1 and not tracked:
        raise ValueError(f"tensor parallel with dropout {config.dropout} needs a random-state "
                         "tracker, or the ranks draw the same masks where they must differ: pass "
                         "parallelize(..., tracker=seed_tensor_parallel(seed, group)) (rng.py)")
    if config.dropout and tp > 1 and sequence_parallel:
        raise ValueError(f"dropout {config.dropout} with sequence parallelism is not built here "
                         "(its residual dropouts would need per-rank masks too); use dropout 0")
    if sequence_parallel and config.seq_len % tp:
        raise ValueError(f"sequence parallelism: tp {tp} does not divide seq_len {config.seq_len} "
                         f"({config.seq_len} / {tp} = {config.seq_len / tp:g}); every rank "
                         "holds an equal slice of the sequence")


def parallelize(model, group, sequence_parallel=False, sum_grads=True, tracker=None):
    """The plain `GPT` -> a `TensorParallelGPT` holding this rank's shards, for `group`.
    sum_grads=False (sequence parallel only): the partial gradients of the whole parameters are
    left for one coalesced all-reduce after backward (`grads.all_reduce_sequence_partial_grads`).
    tracker (`rng.seed_tensor_parallel`): with dropout, each dropout draws from the stream
    `dropout.STREAMS` names (the heads' per rank, the residual ones alike on every rank)."""
    check_tp(model.config, dist.get_world_size(group), sequence_parallel, tracker is not None)
    tp_model = TensorParallelGPT(model, group, sequence_parallel, sum_grads)
    return tp_model if tracker is None else track_dropout(tp_model, tracker)


def parallel_block(block, group, sequence_parallel, sum_grads=True):
    """A copy of one `Block` with the layers in `PLAN` replaced by their parallel versions."""
    block = copy.deepcopy(block)
    block.attn = TensorParallelAttention(block.attn, dist.get_world_size(group))
    for path, (kind, options) in PLAN.items():
        parent_path, _, name = path.rpartition(".")
        parent = block.get_submodule(parent_path)  # "" is the block itself
        new = BUILD[kind](getattr(parent, name), group, sequence_parallel, sum_grads, **options)
        setattr(parent, name, new)
    return block


BUILD = {  # PLAN's kinds -> fn(plain module, group, sequence_parallel, sum_grads, **options)
    "column": lambda old, group, sp, _, **o: ColumnParallelLinear(old, group, sequence_parallel=sp, **o),
    "row": lambda old, group, sp, sg: RowParallelLinear(old, group, sequence_parallel=sp, sum_grads=sg),
    "sequence_norm": lambda old, group, sp, sg: SequenceParallelLayerNorm(old, group, sg) if sp else old,
}


class TensorParallelAttention(nn.Module):
    """`CausalSelfAttention` with its heads split over the group: rank r runs heads
    [r a/t, (r+1) a/t). The fused qkv weight is cut per q, k, v (`PLAN`), the output projection
    by rows. Step by step as in `dlcourse.models`, so the same tensors are saved, 1/t of each."""

    def __init__(self, attn, tp_size):
        super().__init__()
        self.n_heads = attn.n_heads // tp_size  # heads on this rank
        self.qkv, self.proj = attn.qkv, attn.proj  # replaced by their parallel versions (PLAN)
        self.attn_dropout, self.resid_dropout = attn.attn_dropout, attn.resid_dropout
        self.register_buffer("causal", attn.causal, persistent=False)

    def forward(self, x):
        qkv = self.qkv(x)  # (B, T, 3h/t), whole sequence even if x is a sequence shard
        B, T, _ = qkv.shape
        q, k, v = qkv.chunk(3, dim=2)  # each (B, T, h/t): this rank's heads
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))  # (B, a/t, T, T)
        scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        probs = self.attn_dropout(F.softmax(scores, dim=-1))
        y = (probs @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, h/t)
        return self.resid_dropout(self.proj(y))  # (B, T, h), or (B, T/t, h) sequence-parallel


class TensorParallelGPT(nn.Module):
    """The course GPT on one rank of a tensor-parallel group. forward: token ids (B, T) ->
    this rank's vocabulary slice of the logits (B, T, V/t); the loss is
    `loss.vocab_parallel_lm_loss`. With sequence_parallel, everything between the attention and
    MLP sublayers (residual stream, LayerNorms, dropout) holds only T/t of the tokens."""

    def __init__(self, model, group, sequence_parallel=False, sum_grads=True):
        super().__init__()
        self.config, self.group, self.sequence_parallel = model.config, group, sequence_parallel
        self.tok_emb = VocabParallelEmbedding(model.tok_emb, group, sequence_parallel)
        if sequence_parallel:
            self.pos_emb = SequenceParallelPositions(model.pos_emb, group, sum_grads)
            self.ln_f = SequenceParallelLayerNorm(model.ln_f, group, sum_grads)
        else:
            self.pos_emb, self.ln_f = copy.deepcopy(model.pos_emb), copy.deepcopy(model.ln_f)
        self.blocks = nn.ModuleList(parallel_block(b, group, sequence_parallel, sum_grads)
                                    for b in model.blocks)
        # the output layer is column-parallel over the vocabulary; tied, it is the embedding's shard
        self.lm_head = ColumnParallelLinear(model.lm_head, group, sequence_parallel=sequence_parallel)
        if model.config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx):
        T = idx.size(1)
        if T > self.config.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len {self.config.seq_len}")
        if self.sequence_parallel:
            x = self.tok_emb(idx) + self.pos_emb(T, idx.device)  # (B, T/t, h)
        else:
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))  # (B, T, h)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V/t)


def full_parameters(model, group):
    """{name: the whole parameter} on every rank: sharded ones all-gathered and put back
    together (`layers.unshard`), replicated ones as they are. Names are the plain model's."""
    t = dist.get_world_size(group)
    out = {}
    for name, p in model.named_parameters():
        if not hasattr(p, "tp_dim"):
            out[name] = p.detach().clone()
            continue
        shards = [torch.empty_like(p) for _ in range(t)]
        dist.all_gather(shards, p.detach().contiguous(), group=group)
        out[name] = unshard(shards, p.tp_dim, p.tp_parts)
    return out
