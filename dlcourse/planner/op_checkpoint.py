"""Selective activation checkpointing by op, as torchtitan runs it (lesson 07's planner, beside
lesson 01's none and full: `dlcourse/memory/recompute.py`).

torchtitan (pytorch/torchtitan b5bcd76, 2026-08-21, torchtitan/distributed/activation_checkpoint.py,
`SelectiveAC`) runs each transformer block under `torch.utils.checkpoint` with a policy made by
torch's `create_selective_checkpoint_contexts`: the output of every compute-intensive op (torch's
partitioner list, `get_default_op_list().compute_intensive_ops`: mm, addmm, bmm, the SDPA
kernels, ...) is saved, except every second mm of the block's forward, which is recomputed in
backward with everything cheap (norms, GELU/SiLU, softmax, views). Until 2026-03-23 (commit
114151ad4 removed it) it also had a per-layer option: every k-th block checkpointed whole, the
others saving everything (`layer_frequency` here).

What a block keeps, derived: its input (the checkpoint's), and the outputs of the matmuls the
policy saves. For the course GPT without biases (Linear -> aten.mm; with biases it is addmm,
which the policy saves every time, never alternating) its mms run qkv, proj, fc, proj: the 1st
and 3rd are saved (b s 3h and b s 4h), the 2nd and 4th recomputed (2 b s h^2 and 8 b s h^2 FLOPs
again; torchtitan passes early_stop=False, so the 4th runs though backward needs only its
input: torch's default would stop before it and recompute 2 b s h^2); its attention's two bmms are saved too (Q K^T: b a s^2; probs V: b s h). So a block
keeps b s (h + 3h + 4h + h) + b a s^2 values, and its backward recomputes 10 b s h^2 FLOPs of
matmuls. `measure_kept` reads torch's own cache of saved outputs and finds exactly that
(tests/test_planner_op_checkpoint.py).
"""

import torch
from torch._functorch.partitioners import get_default_op_list
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

SAVED_OPS = {op.default for op in get_default_op_list().compute_intensive_ops}
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)


def every_other_matmul_policy():
    """A fresh policy for one block's forward (and its recompute): save what `SAVED_OPS` lists,
    except the 2nd, 4th, ... mm, which is recomputed, as is every other op."""
    seen = {"forward": 0, "recompute": 0}  # mms counted in each pass, to agree on the same ones

    def policy(ctx, op, *args, **kwargs):
        phase = "recompute" if ctx.is_recompute else "forward"
        if op in MATMULS:
            seen[phase] += 1
            if seen[phase] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


class OpCheckpointed(torch.nn.Module):
    """A block run under selective checkpointing by op; `caches` collects, per forward, torch's
    cache of the outputs it saved (the storage `create_selective_checkpoint_contexts` fills)."""

    def __init__(self, block, caches):
        super().__init__()
        self.block, self.caches = block, caches

    def contexts(self):
        forward, recompute = create_selective_checkpoint_contexts(every_other_matmul_policy())
        self.caches.append(forward.storage)  # {op key: {call index: saved output or a marker}}
        return forward, recompute

    def forward(self, x):
        # early_stop=False as torchtitan passes it: the recompute runs the block's whole forward,
        # even the last mm, whose output backward does not need (torch's default stops before)
        return checkpoint(self.block, x, use_reentrant=False, context_fn=self.contexts,
                          early_stop=False)


def checkpoint_blocks_by_op(model, layer_frequency=1):
    """Wrap the course GPT's blocks in place: every `layer_frequency`-th block (the k-th, 2k-th,
    ... as torchtitan counted) by op. Returns the list the blocks' caches go to."""
    caches = []
    for i, block in enumerate(model.blocks):
        if (i + 1) % layer_frequency == 0:
            model.blocks[i] = OpCheckpointed(block, caches)
    return caches


def measure_kept(caches):
    """Bytes the checkpointed blocks keep beyond their inputs: every saved output in torch's
    caches, each storage once."""
    seen, total = set(), 0
    for cache in caches:
        for calls in cache.values():
            for saved in calls.values():
                for wrapped in saved if isinstance(saved, (tuple, list)) else [saved]:
                    t = getattr(wrapped, "val", None)
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                        seen.add(t.untyped_storage().data_ptr())
                        total += t.untyped_storage().nbytes()
    return total


def course_block_kept_values(config, batch):
    """Values one course-GPT block keeps under the policy (no biases), input included:
    b s (h + 3h + 4h + h) + b a s^2 (module docstring)."""
    b, s, h, a = batch, config.seq_len, config.hidden, config.n_heads
    return b * s * (h + 3 * h + 4 * h + h) + b * a * s * s


def course_block_recomputed_flops(config, batch):
    """Matmul FLOPs the backward runs again for one block: its 2nd and 4th mm, 10 b s h^2."""
    return 10 * batch * config.seq_len * config.hidden ** 2
