"""Running a lesson-03 exercise on data-parallel replicas, and reading what it did.

The lesson's five checks (`broadcast_parameters.py` to `accumulate_step.py`) build on these pieces:
- the models the students never see (`MODELS`: a small MLP, the course GPT with its tied
  embedding and output weight, an MLP with a parameter no layer uses and a frozen one), their data
  and losses, built the same from a seed in any process (defined in `in_rank.py`, the rank side,
  with `Watch`);
- the reference: one process training the same model on the whole batch (`whole_batch`), and the
  gradient of any part of a batch at given weights (`gradient_at`);
- `Watch`: lesson 02's CommCounter, noting also which parameter's values a collective carried (a
  gradient's memory is not its parameter's) and each call of `loss_fn` in between;
- `explain_step`: SGD moves a weight by lr x gradient, so (before - after) / lr is the gradient
  a step used; compared with what each typical mistake would have used, it names the mistake.
"""


import torch

from dlcourse.checks.core import fail, run_on_ranks
# what a rank builds and watches (`in_rank.py`, the set's rank side), shared with the checks
from dlcourse.checks.data.in_rank import (GPT_CONFIG, MLP_CONFIG, MODELS, OPTIMIZERS,  # noqa: F401
                                          SEED, Watch, build, gradients, loss_of, optimizer,
                                          snapshot)


LR = OPTIMIZERS["SGD"][1]  # the step's lr: (before - after) / LR is the gradient SGD used


def sizes_text(sizes):
    """"3, 3, 2": samples on each rank (or in each micro-batch), as the messages print them."""
    return ", ".join(map(str, sizes))


# ---------------------------------------------------------------- models and data

def batch(name, n, seed, dtype=torch.float32):
    return MODELS[name][1](n, seed, dtype)


def shards(samples, sizes):
    """[(x, y)] of each rank: the next sizes[r] samples of (x, y)."""
    return list(zip(*(t.split(list(sizes)) for t in samples)))


def run_steps(fn, steps, **run):
    """`run_on_ranks(fn, ..., **run)` on len(steps[0]) ranks, rank r sent ([its part of step 1,
    of step 2, ...],) from steps[k][r]: its own shards only, never the whole batch."""
    return run_on_ranks(fn, [([step[r] for step in steps],) for r in range(len(steps[0]))], **run)


# Rounding. A sum over ranks adds the same float32 numbers in another order than one process's
# matmul does, so gradients differ by ~1e-9 (lesson 03, step 1). Measured on these cases: the
# weights after 2-3 SGD steps at lr 0.1 differ by 4e-9 at most, after AdamW steps at lr 1e-3 by
# 5e-10 (AdamW turns a gradient that is pure rounding noise into a full step, lesson 03; these
# models have none). 1e-6 allows 250 times that; the mistakes move some weight by 1e-2 or more
# with SGD (the sum of 4 ranks: 5e-2), by 1e-3 with AdamW (averaged parameters). float64 rounds
# ~1e-9 times less.
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}


# ---------------------------------------------------------------- the reference

def whole_batch(model, opt, batches, loss_fn):
    """One process, the whole batch each step: the weights before and after every step."""
    weights = [snapshot(model)]
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        weights.append(snapshot(model))
    return weights


def gradient_at(name, weights, x, y, dtype=torch.float32):
    """One process: the gradient of the mean loss of (x, y) at `weights`, zeros for a parameter
    that gets none."""
    model = build(name, dtype)
    model.load_state_dict(weights, strict=False)  # a tied weight is listed once
    loss_of(name)(model(x), y).backward()
    return {n: torch.zeros_like(p) if p.grad is None else p.grad
            for n, p in model.named_parameters()}


def combine(terms):
    """The sum of number x gradient over [(number, {name: gradient})]."""
    return {n: sum(c * g[n] for c, g in terms) for n in terms[0][1]}


# ---------------------------------------------------------------- running the student's code

def expect_gradients_reduced(events, where, rank, hint):
    """Fail if an all-reduce carried a parameter's values instead of a gradient."""
    __tracebackhide__ = True
    for op, _, name in events:
        if op == "all_reduce" and name is not None:
            fail(where, rank, f"all-reduced the values of parameter {name} (the parameter itself, "
                              "or p.data), not its gradient", hint)


# ---------------------------------------------------------------- reading a step back

def _close(a, b):
    # Read back from float32 weights, a gradient carries ~1e-7 / lr of rounding; a mistake
    # changes it by a factor (2, 4/3, 1/W, ...) or more.
    return all(torch.allclose(a[n], b[n], rtol=1e-3, atol=1e-5) for n in a)


def _scaled(a, b):
    """Is a = c x b for some number c != 0 (b's direction, at any scale)?"""
    dot = sum((a[n] * b[n]).sum() for n in a)
    norm = sum((b[n] * b[n]).sum() for n in b)
    return bool(norm > 0 and dot != 0) and _close(a, combine([(float(dot / norm), b)]))


def explain_step(before, after, lr, candidates, otherwise):
    """The hint for an SGD step that went wrong: the gradient it used, (before - after) / lr,
    compared with what each mistake in `candidates` [(gradient, hint, any_scale)] would have
    used (any_scale: in that direction at any scale, e.g. a rank's own gradient however its loss
    was weighted)."""
    used = {n: (before[n] - after[n]) / lr for n in before}
    for gradient, hint, any_scale in candidates:
        if _scaled(used, gradient) if any_scale else _close(used, gradient):
            return hint
    return otherwise


def expect_weights(got, expected, *, where, rank, step, explain):
    """Fail if any weight is beyond rounding from the whole batch's, naming the element farthest
    from it (over all parameters); `explain()` gives the hint."""
    __tracebackhide__ = True
    gaps = {name: (got[name] - want).abs() for name, want in expected.items()}
    tol = TOLERANCE[next(iter(expected.values())).dtype]
    wrong = sum(int((gap > tol).sum()) for gap in gaps.values())
    if wrong:
        name = max(gaps, key=lambda n: gaps[n].max())
        at, worst = worst_element(gaps[name])
        fail(where, rank, f"after step {step}: parameter {name}{at} is "
                          f"{got[name][worst].item():.6g}, one process on the whole batch has "
                          f"{expected[name][worst].item():.6g} ({wrong} of "
                          f"{sum(g.numel() for g in gaps.values())} weights differ by more than "
                          f"{tol:g}, the rounding allowed)", explain())


def worst_element(gap):
    """(' element [i, j]', index) of the largest difference."""
    if not gap.dim():
        return "", ()
    index = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return f" element {list(index)}", index


def count(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"
