"""Check for lesson 10's fifth exercise (`exercises/10_debugging.ipynb`), on real gloo ranks:

    check_sync_tied_grads(sync_tied_grads)   the fix of the catalogue's pp_tied_embeddings_unsynced

The GPT uses one (V, h) matrix twice, as the token embedding and as the output layer. Cut into
pipeline stages, the first stage holds it as `tok_emb.weight` and the last as `lm_head.weight`;
each copy's gradient holds only its own use, and with the bug on (the catalogue's patch: lesson
06's exchange left out) the copies learn apart. The student's function goes where the bug took
the exchange out (`executor.sync_tied_grads`, called by every rank after the schedule's backward
and before the optimizer step) and runs inside lesson 06's 1F1B trainer (lesson 07's grid,
`debug.subjects.grid_subject`) for 2 AdamW steps. Every whole gradient the optimizer uses and
every parameter after each step are compared with the same GPT trained in one process (computed
here, not in the ranks), in float64, on 2 and 3 stages in a random order: a fix that knows only
the two ranks of a 2-stage pipeline fails on 3, where the last stage is rank 2 and rank 1 holds
no copy. A fix that hides the symptom (the copies made equal by sending the parameter across)
fails on the first step's gradient of tok_emb.weight, which lacks the output layer's part.
Last, 2 stages beside data parallelism (dp = 2, 4 ranks: stage 0 on ranks 0 and 1, stage 1 on 2
and 3): `group` is one pipeline's ranks, not the world, so a fix that finds the other end from
the world's ranks (the last rank, rank 0) leaves two of the four waiting. Each call's messages
are counted (CommCounter): a rank holding a copy must be brought at least a gradient's bytes by
torch.distributed, so copies that swap gradients through a shared file fail.
"""

from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.checks.debug.answers import ANSWERS
from dlcourse.checks.debug.sync_sequence_parallel_grads import reference_run
from dlcourse.checks.debug.in_rank import MICRO_BATCHES, STEPS, pp_config as config, tied_in_rank
from dlcourse.debug.compare import TOLERANCE

# The fifth exercise's answer more: lesson 06's exchange of the tied embedding's gradients, and
# the helper that finds its two copies (`dlcourse.parallel.pipeline.stages`); the pipeline's own
# stages run in the rank: refused there, not absent.
TIED_ANSWERS = ANSWERS.but(single=(("dlcourse.parallel.pipeline.stages", "sync_tied_grads"),
                                   ("dlcourse.parallel.pipeline.stages", "tied_ends")),
                           rank_side=ANSWERS.rank_side + ("dlcourse.parallel.pipeline.stages",))

HINT = ("after backward, the first stage's tok_emb.weight and the last stage's lm_head.weight "
        "must both hold the sum of the two copies' gradients; find the two ranks from `group` "
        "and each stage's is_first / is_last, never from the number of ranks you tried")


HANG_HINT = ("a rank waits for a message its peer never sends: `group` holds one pipeline's "
             "ranks, which beside data parallelism are not the world's; find the other end in "
             "`group` (dist.get_global_rank(group, ...)), not from dist.get_world_size()")


@fresh_cases
def check_sync_tied_grads(sync_tied_grads, timeout=CHECK_TIMEOUT_S, *, rng):
    """sync_tied_grads(stages, group): in place, after backward, both copies of the tied
    embedding given the sum of their gradients; compared over 2 steps on 2 and 3 stages."""
    __tracebackhide__ = True
    expect_callable(sync_tied_grads, "sync_tied_grads")
    sizes = [2, 3]
    rng.shuffle(sizes)
    for n_stages, dp in [(n, 1) for n in sizes] + [(2, 2)]:  # then beside data parallelism
        seed = rng.randrange(10**6)
        want = reference_run(config(n_stages, seed), "PP 1F1B (lesson 06)")
        where = (f"sync_tied_grads on {n_stages} pipeline stages (1F1B, {MICRO_BATCHES // dp} "
                 f"micro-batches" + (f", each stage on {dp} data-parallel ranks" if dp > 1
                                     else "") + f", weights seed {seed})")
        outcomes = run_on_ranks(sync_tied_grads, [(n_stages, seed, dp)] * (n_stages * dp),
                                exercise="sync_tied_grads", where=where, hint=HINT,
                                hang_hint=HANG_HINT, harness=tied_in_rank,
                                guard=TIED_ANSWERS.in_rank, timeout=timeout)
        for rank, ((got, received, need), _) in enumerate(outcomes):
            _expect_message(received, need, where, rank)
            _expect_run(got, want, where, rank)
    print(f"sync_tied_grads: passed on {', '.join(map(str, sizes))} pipeline stages, and 2 "
          "beside 2-way data parallelism (1F1B, "
          f"{STEPS} AdamW steps, weights drawn at random): every gradient before each step and "
          "every parameter after it equal one process's, to float64 rounding")


def _expect_message(received, need, where, rank):
    """A rank that holds one copy must be brought the other's gradient by a message."""
    __tracebackhide__ = True
    short = [b for b in received if b < need]
    if short:
        fail(where, rank, f"holds a copy of the tied matrix, but a call of your function brought "
                          f"it {short[0]} bytes by torch.distributed, less than the other copy's "
                          f"gradient ({need} bytes)", "the two copies live on two ranks, maybe "
                          "two machines: the other copy's gradient must come as a message "
                          "(send/recv or a collective over `group`), not a file or another "
                          "side channel")


def _expect_run(got, want, where, rank):
    __tracebackhide__ = True
    for step, ((grads, params), (want_grads, want_params)) in enumerate(zip(got, want), 1):
        for phase, mine, ref in (("gradient", grads, want_grads),
                                 ("parameter after the step", params, want_params)):
            for name, w in ref.items():  # the model's order
                diff = (mine[name] - w).abs().max().item()
                if diff > TOLERANCE * max(1.0, w.abs().max().item()):
                    fail(where, rank, f"step {step}: {phase} of {name} differs from one process's"
                                      f" by up to {diff:.2e} (values up to "
                                      f"{w.abs().max().item():.2e})", _hint(step, phase, name))


def _hint(step, phase, name):
    """What the first gap says: the copy's gradient incomplete, or the copies apart after it."""
    if step == 1 and phase == "gradient" and name == "tok_emb.weight":
        return ("the first stage's copy must get both uses' gradients, its own plus the output "
                "layer's from the last stage; making the copies' values equal does not give it "
                "the part it missed")
    if step == 1:
        return HINT
    return ("step 1 was right where the gradients were gathered, but the last stage's copy "
            "(lm_head.weight) learnt otherwise: give it the same summed gradient as the first's")
