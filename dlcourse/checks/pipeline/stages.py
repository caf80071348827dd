"""Running a lesson-06 exercise on pipeline stages: the pieces the checks of lesson 06
share.

- The reference: one process, the whole batch (`whole_batch`), of the check's pipeline
  (`Chain`, in `in_rank.py` with the check's executor `run_actions`: the rank-side code, which
  a graded rank loads alone; `in_rank.schedule_problem` plays a schedule before it runs).
- `stage_counts`: the numbers of stages a check draws, never p = 4 alone.
"""

import torch
import torch.nn.functional as F

from dlcourse.checks.core import fail
from dlcourse.checks.pipeline.in_rank import stage_grads


# ---------------------------------------------------------------- the pipeline and its reference


def whole_batch(chain, micro_batches):
    """One process: the gradient of the mean loss over the whole batch, per stage."""
    model = chain.layers(0, chain.bounds[-1])
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    F.mse_loss(model(x), y).backward()
    grads = stage_grads(model)  # 2 tensors (weight, bias) per layer, in order
    return [grads[2 * a:2 * b] for a, b in zip(chain.bounds, chain.bounds[1:])]


# float64 rounds ~1e-16; summing m micro-batches' gradients instead of one matmul over the batch
# moves a value by a few of those. 1e-10 allows 10^5 times that; the mistakes the checks name
# change a gradient by a factor (m, 1/m, p) or drop a micro-batch's part.
RTOL, ATOL = 1e-10, 1e-12

def expect_stage_grads(got, expected, *, where, rank, explain):
    """Fail unless this stage's gradients equal one process's on the whole batch."""
    __tracebackhide__ = True
    for k, (g, e) in enumerate(zip(got, expected)):
        name = f"layer {k // 2} {'weight' if k % 2 == 0 else 'bias'}"
        if g is None:
            fail(where, rank, f"has no gradient for its {name}", explain())
        wrong = ~torch.isclose(g, e, rtol=RTOL, atol=ATOL)
        if wrong.any():
            at = tuple(wrong.nonzero()[0].tolist())
            fail(where, rank, f"{name} gradient element {list(at)} is {g[at].item():.6g}, one "
                              f"process on the whole batch has {e[at].item():.6g} "
                              f"({int(wrong.sum())} of {wrong.numel()} differ)", explain())


# ---------------------------------------------------------------- drawing cases


def stage_counts(rng, n):
    """n values of p from 2 to 5, at least two of them not 4, in random order."""
    ps = rng.sample([2, 3, 5], 2) + [rng.randint(2, 5) for _ in range(n - 2)]
    rng.shuffle(ps)
    return ps


def join(items):
    return ", ".join(map(str, items))


