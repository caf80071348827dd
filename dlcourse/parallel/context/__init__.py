"""Context parallelism (lesson 08, `lessons/08_context_parallel.ipynb`): every rank of a group
keeps s/cp tokens of each sequence through the whole model; attention, the only layer that needs
other tokens, gets them by communication.

    blockwise.py    attention of one query block against one key/value block -> (out, lse); the
                    online-softmax merge; the block's backward; BlockAttention (one rank)
    layout.py       Layout: contiguous or zig-zag chunks, shard / unshard; causal_work per rank
    documents.py    document masks under CP, counted: scores kept and K/V needed per rank
    ring.py         ring attention: K/V around the ring with send/recv, forward and backward
    kernels.py      how the ring computes one block: written out, or torch's fused CPU kernel
    ulysses.py      DeepSpeed-Ulysses: all-to-all to head-sharded and back
    allgather.py    K/V by all-gather (torch's default in its experimental context_parallel)
    parallelize.py  METHODS, check_cp, context_parallel(model, group, method), average_gradients
    measure.py      one layer's communication and each rank's saved activations beside formulas
    compare.py      time_attention: the methods and one process timed side by side (benchmark);
                    a chunk pair's cost and its steps; core sharing, measured
"""

from dlcourse.parallel.context.allgather import allgather_attention
from dlcourse.parallel.context.blockwise import (attention_block, attention_block_backward,
                                                 block_attention, merge)
from dlcourse.parallel.context.layout import LAYOUTS, Layout, causal_scores, causal_work
from dlcourse.parallel.context.parallelize import (METHODS, average_gradients, check_cp,
                                                   context_parallel, cp_layout)
from dlcourse.parallel.context.ring import ring_attention
from dlcourse.parallel.context.ulysses import check_ulysses, ulysses_attention

__all__ = [
    "allgather_attention", "attention_block", "attention_block_backward", "block_attention",
    "merge", "LAYOUTS", "Layout", "causal_scores", "causal_work", "METHODS", "average_gradients",
    "check_cp", "context_parallel", "cp_layout", "ring_attention", "check_ulysses",
    "ulysses_attention",
]
