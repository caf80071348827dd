"""FSDP2 with bf16 (MixedPrecisionPolicy) proven equal to the from-scratch mixed-precision
stage 3 (lesson 05), on 2 gloo ranks, after K AdamW steps of the course GPT (tiny config).

Both sides round at the same points, so they agree bit for bit:
  - forward and backward run on bf16 parameters: ZeroStage3's own bf16 shards; FSDP2 casts its
    fp32 shards to bf16 before the all-gather (param_dtype). Same values if the fp32 master
    starts as the bf16 one, so FSDP2's model starts from the bf16-rounded initial weights: with
    the raw fp32 init its masters differ from ours by up to bf16's half-ulp (2^-9 relative) from
    step 0 on, and AdamW carries that into every step.
  - the gradient reduce-scatter in bf16 (reduce_dtype): FSDP2 on gloo divides by its
    pre-divide factor before the sum and by the rest after; at N = 2 that is /2 before and /1
    after, ZeroStage3 sums and then divides by 2. Halving is exact in bf16 (a power of two, no
    underflow at these sizes), so round(a/2 + b/2) = round(a + b)/2: the same bits. At N = 3
    (test_zero_torch.py) FSDP2 divides by 3 = not exact, hence no such test there.
  - AdamW on fp32 masters with the bf16 gradient shard cast to fp32, elementwise, then cast
    back to bf16 for the next step's parameters.
TOLERANCE is 0: any difference is a different rounding point, not noise.
"""

import pytest
import torch
import torch.distributed as dist

import dlcourse
from dlcourse.models import GPT, GPTConfig, synthetic_tokens
from dlcourse.parallel.data.steps import shard_batch
from dlcourse.parallel.zero import ZeroAdamW, zero
from dlcourse.parallel.zero.measure import train_steps
from dlcourse.parallel.zero.torch_api import fsdp2, fsdp2_full_parameters

CFG = GPTConfig(vocab_size=31, seq_len=8, n_layers=2, n_heads=2, hidden=16)
N, STEPS, LR = 2, 3, 1e-2
TOLERANCE = 0.0  # same rounding points on both sides (module docstring)


def job():
    group = dist.group.WORLD
    x, y = shard_batch(synthetic_tokens(2 * N, CFG, seed=1), group)
    model = zero(3, GPT(CFG).to(torch.bfloat16), group)
    train_steps(model, ZeroAdamW(model, lr=LR), x, y, STEPS)
    mine = model.full_parameters()
    start = GPT(CFG).to(torch.bfloat16).to(torch.float32)  # fp32 masters = bf16 weights
    model, optimizer = fsdp2(start, group, lr=LR, mixed_precision=torch.bfloat16)
    train_steps(model, optimizer, x, y, STEPS)
    theirs = fsdp2_full_parameters(model)  # fp32 masters: compare as the bf16 parameters
    return {n: (mine[n].float() - theirs[n].to(torch.bfloat16).float()).abs().max().item()
            for n in mine}


@pytest.fixture(scope="module")
def diffs():
    return dlcourse.launch(job, world_size=N, backend="gloo")


def test_fsdp2_bf16_equals_mixed_precision_stage_3(diffs):
    for rank, d in enumerate(diffs):
        worst = max(d, key=d.get)
        assert d[worst] <= TOLERANCE, f"rank {rank}: {worst} differs by {d[worst]:.3g}"
