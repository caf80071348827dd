"""The planner's transients (dlcourse/planner/transients.py) against what torch allocates.

The loss's bytes a logit at its peak are measured with lesson 01's `measure_peak` (torch's
profiler, every CPU allocation) on an output head alone: bf16 logits of N tokens x V classes
from a width-h head. Besides the logits' tensors the step allocates the head's bf16 weight
gradient (V x h x 2 bytes: 2h/N bytes a logit, 0.03 here) and the loss scalars: the
tolerance, 0.05 bytes a logit, is that and no more. Full recomputation's rebuilt layer is
measured the same way on a checkpointed course GPT; FSDP2's buffers in flight are read from
FSDP2's own state in a 2-rank gloo run.
"""

import pytest
import torch

from dlcourse.memory.peak import measure_peak
from dlcourse.planner.transients import LOSS, LOSS_KEPT_BYTES, LOSS_PEAK_BYTES

N, V, H = 512, 8192, 8  # tokens, vocabulary, head width
TOL = 0.05  # bytes a logit: the weight gradient, 2H/N = 0.03, and scalars


class InPlaceCrossEntropy(torch.autograd.Function):
    """Megatron-LM's vocab-parallel cross-entropy at tp = 1 (megatron/core/tensor_parallel/
    cross_entropy.py): exp written into its input, the softmax saved, the gradient written into
    the saved softmax. Megatron calls it on logits.float()."""

    @staticmethod
    def forward(ctx, logits, target):  # logits (N, V) fp32, a copy nobody else holds
        logits.sub_(logits.max(dim=-1, keepdim=True).values)
        picked = logits.gather(-1, target[:, None]).squeeze(-1)
        torch.exp(logits, out=logits)
        total = logits.sum(dim=-1)
        logits.div_(total[:, None])  # now the softmax
        ctx.save_for_backward(logits, target)
        return (torch.log(total) - picked).mean()

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target = ctx.saved_tensors
        grad = softmax  # in place, as Megatron's backward does
        grad[torch.arange(len(target)), target] -= 1.0
        grad.mul_(grad_output / len(target))
        return grad, None


def _loss(kind, kept):
    """The loss of `kind` as its framework calls it; `kept` holds what train.py holds."""
    def fn(pred, labels):
        if kind == "in place":
            return InPlaceCrossEntropy.apply(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        if kind == "fp32 eager, pred kept":  # torchtitan 395a526: model returns .float()
            pred = pred.float()
            kept.append(pred)  # train.py's `pred`, alive through loss.backward()
        return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(),
                                                 labels.flatten(0, 1))
    return fn


@pytest.mark.parametrize("kind", LOSS)
def test_the_losss_peak_and_kept_bytes_a_logit_are_measured(kind):
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V, bias=False).to(torch.bfloat16)
    x, y = torch.randn(1, N, H, dtype=torch.bfloat16), torch.randint(0, V, (1, N))
    base = sum(t.numel() * t.element_size() for t in [*head.parameters(), x, y])
    kept = []
    peak = measure_peak(head, x, y, _loss(kind, kept))
    assert (peak.bytes - base) / (N * V) == pytest.approx(LOSS_PEAK_BYTES[kind], abs=TOL)
    held = LOSS_KEPT_BYTES + (4 if kept else 0)  # the log-probabilities (and a kept pred)
    assert (peak.at_forward_end - base) / (N * V) == pytest.approx(held, abs=TOL)


def test_the_in_place_loss_gives_torchs_gradient():
    """The stand-in for Megatron's loss is a cross-entropy: its loss and gradient are torch's."""
    torch.manual_seed(0)
    logits = torch.randn(16, 10, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 10, (16,))
    ours = InPlaceCrossEntropy.apply(logits.clone(), target)
    (g_ours,) = torch.autograd.grad(ours, logits)
    ref = torch.nn.functional.cross_entropy(logits, target)
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    assert torch.allclose(g_ours, g_ref, rtol=0, atol=1e-12)


def test_full_recomputation_rebuilds_one_layer_at_a_time():
    """A checkpointed course GPT (fp32, dropout 0, the blocks' weights frozen so that their
    gradients, model state the planner counts apart, do not grow the peak): backward's peak
    above what forward left is the same for 2 and 4 layers (one layer rebuilt at a time), and
    it is `rebuilt_layer_bytes` for that layer's shape (eager attention, fp32 values and
    LayerNorm statistics, as the CPU runs it) within 2%: torch's non-reentrant checkpoint stops
    rebuilding once the last tensor backward needs is saved (measured: 1.1% under)."""
    from dlcourse.memory import checkpoint_blocks
    from dlcourse.memory.calculator import ModelSpec
    from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
    from dlcourse.planner.transients import rebuilt_layer_bytes

    above = []
    for layers in (2, 4):
        cfg = GPTConfig(vocab_size=16, seq_len=64, n_layers=layers, n_heads=4, hidden=64)
        x, y = synthetic_tokens(4, cfg)
        model = checkpoint_blocks(GPT(cfg))
        for name, p in model.named_parameters():
            p.requires_grad_(not name.startswith("blocks."))
        peak = measure_peak(model, x, y, lm_loss)
        above.append(peak.bytes - peak.at_forward_end)
    spec = ModelSpec("course GPT", 2, 64, 4, 16, 64, ffn=256, kv_heads=4, gated_mlp=False,
                     bias=True, tied=True, learned_positions=True)
    predicted = rebuilt_layer_bytes(spec, 64, 4, attention="eager", bytes_per_value=4,
                                    stat_bytes=4)
    assert above[0] == above[1]
    assert above[0] == pytest.approx(predicted, rel=0.02)


def _fsdp2_in_flight():
    """One rank of a 2-rank FSDP2 course GPT (bf16 parameters, fp32 reduce-scatter: torchtitan's
    MixedPrecisionPolicy): what FSDP2 holds, in bytes per parameter of one block, when the
    gradient reaches block 1's attention output (its MLP's backward done): per block
    (unsharded parameters, all-gather output not yet copied out, unsharded gradients), and the
    reduce-scatter inputs it keeps."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=16, seq_len=8, n_layers=4, n_heads=4, hidden=64)
    model = GPT(cfg)
    layer = sum(p.numel() for p in model.blocks[0].parameters())
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    groups = [block._get_fsdp_state()._fsdp_param_group for block in model.blocks]
    seen = {}

    def per_param(tensors):
        return sum(t.untyped_storage().nbytes() for t in tensors) / layer

    def snapshot(_):
        blocks = []
        for g in groups:
            grads = [fp._unsharded_param.grad for fp in g.fsdp_params
                     if fp._unsharded_param.grad is not None]
            gathered = g._all_gather_result
            blocks.append((per_param(t for fp in g.fsdp_params for t in fp.all_gather_outputs),
                           per_param([gathered.all_gather_output]) if gathered else 0.0,
                           per_param(grads), {str(t.dtype) for t in grads}))
        seen["blocks"] = blocks
        seen["reduce_scatter"] = per_param(s.reduce_scatter_input
                                           for s in groups[0].comm_ctx.reduce_scatter_states)

    model.blocks[1].attn.register_forward_hook(lambda m, i, out: _hook(out, snapshot))
    x, y = synthetic_tokens(2, cfg)
    lm_loss(model(x), y).backward()
    return seen


def _hook(tensor, fn):
    tensor.register_hook(fn)  # returns None: the forward hook leaves the output as it is


def test_fsdp2_holds_two_layers_their_gradients_and_one_reduce_scatter_input_in_backward():
    """torch 2.13's FSDP2 in backward (`transients.ZERO3_BACKWARD_BYTES`): the running block
    unsharded (2 bytes a parameter in bf16), the next one prefetched (its all-gather output, 2),
    the running block's bf16 gradients (2 once its backward ends; 2/3 of the block, the MLP, so
    far), the block before's fp32 reduce-scatter input (4); nothing of the other blocks. The
    shapes divide by 2 ranks: no padding, so the sizes are exact."""
    import dlcourse
    from dlcourse.planner.transients import ZERO3_BACKWARD_BYTES

    seen = dlcourse.launch(_fsdp2_in_flight, world_size=2, backend="gloo")[0]
    (u0, f0, g0, _), (u1, f1, g1, dtypes), *rest = seen["blocks"]
    assert (u0, f0, g0) == (0.0, 2.0, 0.0)  # block 0: prefetched, not yet copied out
    assert (u1, f1) == (2.0, 0.0) and 0 < g1 < 2 and dtypes == {"torch.bfloat16"}
    assert all(b[:3] == (0.0, 0.0, 0.0) for b in rest)
    assert seen["reduce_scatter"] == 4.0  # block 2's, fp32
    assert u1 + f0 + 2 + seen["reduce_scatter"] == ZERO3_BACKWARD_BYTES
