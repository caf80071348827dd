"""Checks for lesson 08's exercises (`exercises/08_context_parallel.ipynb`): context parallelism
by hand.

    check_merge_partials(merge_partials)            two blocks' attention joined by their lse
    check_zigzag_positions(zigzag_positions)        the tokens a rank holds in the zig-zag layout
    check_ring_attention_step(ring_attention_step)  one ring step: send/recv K/V, attend, merge
    check_seq_to_heads(seq_to_heads)                Ulysses' all-to-all to head-sharded
    check_cp_bytes_per_layer(cp_bytes_per_layer)    the bytes a rank sends for one layer

One module per exercise (`merge_partials.py`, `zigzag_positions.py`, `ring_attention_step.py`,
`seq_to_heads.py`, `cp_bytes_per_layer.py`; the wrong ring steps in `ring_mistakes.py`); the
references are plain float64 attention and the layouts from their definitions (`reference.py`),
the bytes from the lesson's `layer_formula` (called after the student's function), and what is
refused while a student's code runs is in `answers.py`: the lesson's `dlcourse.parallel.context`,
torch's `context_parallel` and its pieces, and these references. Cases are drawn afresh on each
run (2 to 8 ranks, never 4 alone) and a failure names the seed (`seed=` draws them again).
"""

from dlcourse.checks.context.cp_bytes_per_layer import check_cp_bytes_per_layer
from dlcourse.checks.context.merge_partials import check_merge_partials
from dlcourse.checks.context.ring_attention_step import check_ring_attention_step
from dlcourse.checks.context.seq_to_heads import check_seq_to_heads
from dlcourse.checks.context.zigzag_positions import check_zigzag_positions

__all__ = ["check_merge_partials", "check_zigzag_positions", "check_ring_attention_step",
           "check_seq_to_heads", "check_cp_bytes_per_layer"]
