"""The planner's transients (dlcourse/planner/transients.py) against what torch allocates.

The loss's bytes a logit at its peak are measured with lesson 01's `measure_peak` (torch's
profiler, every CPU allocation) on an output head alone: bf16 logits of N tokens x V classes
from a width-h head. Besides the logits' tensors the step allocates the head's bf16 weight
gradient (V x h x 2 bytes: 2h/N bytes a logit, 0.03 here) and the loss scalars: the
tolerance, 0.05 bytes a logit, is that and no more.
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
