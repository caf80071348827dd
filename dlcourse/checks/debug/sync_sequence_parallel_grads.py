"""Check for lesson 10's third exercise (`exercises/10_debugging.ipynb`), on real gloo ranks:

    check_sync_sequence_parallel_grads(sync_sequence_parallel_grads)   the fix of a catalogue bug

The bug is the catalogue's `sp_layernorm_grads` (Megatron-LM #1446): under sequence parallelism
every rank holds the LayerNorms, the position embedding and the row-parallel biases whole but
sees only its own T/tp tokens through them, so their gradients are partial, and with the bug on
(`parallelize(sum_grads=False)`) nobody sums them. Each rank runs lesson 04's TP + SP GPT (the
grid trainer of lesson 07, `debug.subjects.grid_subject`) with the bug on for 2 AdamW steps and
calls the student's fix after backward, just before each optimizer step. The check compares,
step by step, every whole gradient the optimizer then uses and every parameter after the step
with the same model trained in one process (computed here, in the checking process, not in the
ranks). On 2 and 3 ranks, in a random order, with weights and data drawn from the seed: a fix
that holds for one world size only fails on the other; a fix that hides the symptom (ranks made
equal by a broadcast, gradients averaged where they must be summed) fails on the gradients even
where AdamW would nearly hide it in the parameters. Each call's messages are counted
(CommCounter): partial gradients summed through a shared file instead fail.
"""


import torch

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.checks.debug.in_rank import STEPS, fix_in_rank, sp_config as config, train
from dlcourse.debug.compare import TOLERANCE
from dlcourse.debug.divergence import reference_subject
from dlcourse.debug.subjects import SUBJECTS

HINT = ("after backward, sum over `group` the gradient of every parameter that each rank holds "
        "whole but sees only its own tokens through (lesson 04's layers say which); leave the "
        "sharded ones alone")


def reference_run(cfg, strategy="TP + SP (lesson 04)"):
    """[per step: ({name: gradient}, {name: parameter after})] of the GPT in one process, as
    `strategy`'s reference builds it (the fifth exercise's too: "PP 1F1B (lesson 06)")."""
    x, y = cfg.data()
    subject, _ = reference_subject(cfg, SUBJECTS[strategy])
    return train(subject, cfg, x, y, fix=None)


@fresh_cases
def check_sync_sequence_parallel_grads(sync_sequence_parallel_grads, timeout=CHECK_TIMEOUT_S,
                                       *, rng):
    """sync_sequence_parallel_grads(model, group): in place, after backward, the gradients the
    bug leaves partial summed over `group`; compared over 2 steps on 2 and 3 ranks."""
    __tracebackhide__ = True
    expect_callable(sync_sequence_parallel_grads, "sync_sequence_parallel_grads")
    sizes = [2, 3]
    rng.shuffle(sizes)
    for world_size in sizes:
        seed = rng.randrange(1000)
        want = reference_run(config(world_size, seed))
        where = f"sync_sequence_parallel_grads on {world_size} ranks (TP + SP, weights seed {seed})"
        outcomes = run_on_ranks(sync_sequence_parallel_grads, [(world_size, seed)] * world_size,
                                exercise="sync_sequence_parallel_grads", where=where, hint=HINT,
                                harness=fix_in_rank, guard=ANSWERS.in_rank,
                                timeout=timeout)
        for rank, ((got, partial, received, need), _) in enumerate(outcomes):
            _expect_messages(received, need, where, rank)
            _expect_run(got, want, where, rank, world_size, partial)
    print(f"sync_sequence_parallel_grads: passed on {', '.join(map(str, sizes))} ranks (TP + SP "
          f"GPT, {STEPS} AdamW steps, weights drawn at random): every gradient before each step "
          "and every parameter after it equal one process's, to float64 rounding")


def _expect_messages(received, need, where, rank):
    """Every rank must be brought the others' partial gradients by messages: at least half their
    bytes (an all-reduce brings all of them, a ring of send/recv 2(n-1)/n, a reduce-scatter then
    an all-gather as much), none through a file."""
    __tracebackhide__ = True
    short = [b for b in received if 2 * b < need]
    if short:
        fail(where, rank, f"a call of your function brought this rank {short[0]} bytes by "
                          f"torch.distributed, for partial gradients of {need} bytes",
             "the other ranks' parts must come as messages over `group` (a collective or "
             "send/recv), not a file or another side channel")


def _expect_run(got, want, where, rank, world_size, partial):
    __tracebackhide__ = True
    for step, ((grads, params), (want_grads, want_params)) in enumerate(zip(got, want), 1):
        for phase, mine, ref in (("gradient", grads, want_grads),
                                 ("parameter after the step", params, want_params)):
            for name, w in ref.items():  # the model's order
                g = mine[name]
                diff = (g - w).abs().max().item()
                if diff > TOLERANCE * max(1.0, w.abs().max().item()):
                    fail(where, rank, f"step {step}: {phase} of {name} differs from one process's"
                                      f" by up to {diff:.2e} (values up to "
                                      f"{w.abs().max().item():.2e})",
                         _hint(g, w, world_size, phase, name in partial))


def _hint(got, want, world_size, phase, partial):
    """What the gap says: averaged, still partial, or a sharded gradient touched."""
    if phase != "gradient":
        return HINT
    if torch.allclose(got * world_size, want, rtol=1e-9, atol=1e-12):
        return (f"that is 1/{world_size} of it: the ranks' partial gradients are pieces of one "
                "sum over the tokens; add them (dist.ReduceOp.SUM), do not average them")
    if partial:
        return ("this parameter is whole on every rank but saw only this rank's tokens: its "
                "gradient is a partial sum until it is summed over the group, on every rank")
    return ("a sharded parameter: each rank's gradient is its own shard's and whole already; "
            "summing it with the other ranks' shards mixes different weights")
