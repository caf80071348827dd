"""What tensor parallelism costs, measured beside the formulas (lesson 04,
`lessons/04_tensor_parallel.ipynb`).

    count_layer(config, batch, group, sequence_parallel)   # one Block's collectives, counted
    layer_formula(config, batch, tp, sequence_parallel)    # the same from Megatron / Korthikanti
    param_bytes(config, tp)                                 # Ψ/t + what stays replicated

Per transformer layer, Megatron's TP makes 2 all-reduces of the (b, s, h) activations in the
forward (after attention and after the MLP: the two g's) and 2 in the backward (the two f's).
Sequence parallelism turns each all-reduce into a reduce-scatter plus an all-gather of the same
b·s·h elements (Korthikanti et al. 2022, Section 4.2.2): the same bytes on a ring, since a ring
all-reduce *is* a reduce-scatter and an all-gather. It adds one small all-reduce in the backward
per parameter that sees only a sequence shard (LayerNorms, the row-parallel biases).
"""

from collections import Counter

import torch

from dlcourse.collectives.counter import CommCounter
from dlcourse.models import Block
from dlcourse.parallel.tensor.comm import sequence_shard
from dlcourse.parallel.tensor.parallelize import parallel_block


def count_layer(config, batch, group, sequence_parallel=False, seed=0):
    """Run one tensor-parallel `Block` forward and backward on random input and count the
    collectives: {"forward": [CommRecord], "backward": [CommRecord]} on this rank."""
    block = parallel_block(Block(config), group, sequence_parallel)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, config.seq_len, config.hidden, generator=gen)  # (B, T, h)
    if sequence_parallel:
        x = sequence_shard(x, group)  # (B, T/t, h)
    x.requires_grad_()
    with CommCounter() as forward:
        y = block(x)
    with CommCounter() as backward:
        y.sum().backward()
    return {"forward": forward.records, "backward": backward.records}


def layer_formula(config, batch, tp, sequence_parallel=False):
    """{"forward"/"backward": Counter({(op, elements): calls})} for one layer, from the papers:
    b·s·h elements per activation collective; h per replicated parameter under sequence
    parallelism (2 LayerNorms, weight and bias, and the two row-parallel biases)."""
    bsh = batch * config.seq_len * config.hidden
    if not sequence_parallel:
        return {"forward": Counter({("all_reduce", bsh): 2}),
                "backward": Counter({("all_reduce", bsh): 2})}
    both = Counter({("all_gather", bsh): 2, ("reduce_scatter", bsh): 2})
    replicated = 6 if config.bias else 2  # ln1, ln2 (+ their biases, + the 2 row biases)
    return {"forward": both, "backward": both + Counter({("all_reduce", config.hidden): replicated})}


def as_counter(records, itemsize=4):
    """CommRecords -> Counter({(op, elements): calls}), to set beside `layer_formula`."""
    return Counter((r.op, r.nbytes // itemsize) for r in records)


def param_bytes(config, tp, itemsize=4):
    """{"sharded": bytes of this rank's 1/t of the split matrices, "replicated": bytes every rank
    holds whole}: Ψ = sharded_total + replicated; per rank sharded_total / t + replicated."""
    V, T, h, L = config.vocab_size, config.seq_len, config.hidden, config.n_layers
    bias = config.bias
    sharded = V * h + L * (12 * h * h + (7 * h if bias else 0))  # qkv + fc biases are split
    sharded += 0 if config.tie_embeddings else V * h  # an untied lm_head is split by vocabulary
    replicated = T * h + L * (6 * h if bias else 2 * h) + (2 * h if bias else h)  # pos, LN, row biases
    return {"sharded": sharded * itemsize // tp, "replicated": replicated * itemsize}


def local_param_bytes(model):
    """Bytes of this rank's parameters, by kind: sharded ones carry `tp_dim` (layers.py)."""
    out = {"sharded": 0, "replicated": 0}
    for p in model.parameters():  # a tied weight is listed once
        out["sharded" if hasattr(p, "tp_dim") else "replicated"] += p.numel() * p.element_size()
    return out


def ring_bytes(records):
    """Bytes this rank moves over its link for `records` on a ring (lesson 02's bus factors)."""
    return sum(r.bus_bytes() for r in records)
