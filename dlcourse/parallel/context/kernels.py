"""The block computation inside ring attention, two ways (lesson 08,
`lessons/08_context_parallel.ipynb`): the ring does not care how one block is computed, as long
as it returns the block's output and log-sum-exp, and its backward takes the final ones.

    "explicit"  `blockwise.attention_block` and its backward: the arithmetic written out, the
                (n, m) scores made in full (what the lesson reads)
    "fused"     torch's flash-attention kernel for CPU (`aten::_scaled_dot_product_flash_attention
                _for_cpu` and its backward, what `F.scaled_dot_product_attention` runs on CPU),
                which returns the log-sum-exp too and whose backward takes the output and
                log-sum-exp it is given: the merged, global ones. CPU tensors only; a block
                must be unmasked or an aligned diagonal block (q_pos == k_pos), the only masked
                blocks the chunked layouts make.

Each kernel: forward(q, k, v, q_pos, k_pos, causal) -> (out, lse);
backward(dout, out, delta, lse, q, k, v, q_pos, k_pos, causal) -> (dq, dk, dv).
"""

import torch

from dlcourse.parallel.context.blockwise import attention_block, attention_block_backward, visible


def _is_causal(q_pos, k_pos, causal):
    """The fused kernel's is_causal flag for this block, or an error for a mask it cannot take."""
    mask = visible(q_pos, k_pos, causal)
    if isinstance(mask, str):
        return False  # "all": no mask ("none" blocks are skipped by the caller)
    if q_pos.shape != k_pos.shape or not torch.equal(q_pos, k_pos):
        raise ValueError("the fused kernel takes only whole or aligned diagonal blocks; "
                         "use kernel='explicit' for other masks")
    return True


def fused_forward(q, k, v, q_pos, k_pos, causal):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, _is_causal(q_pos, k_pos, causal))
    return out, lse  # (b, a, n, d), (b, a, n)


def fused_backward(dout, out, delta, lse, q, k, v, q_pos, k_pos, causal):
    # the kernel computes delta = rowsum(dout ∘ out) itself, from the out it is given
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, _is_causal(q_pos, k_pos, causal))


def explicit_backward(dout, out, delta, lse, q, k, v, q_pos, k_pos, causal):
    return attention_block_backward(dout, delta, lse, q, k, v, q_pos, k_pos, causal)


KERNELS = {  # name -> (forward, backward)
    "explicit": (attention_block, explicit_backward),
    "fused": (fused_forward, fused_backward),
}
