"""The rank side of lesson 10's checks: what runs in a rank while a student's function runs
there: the catalogue's runs with a bug on (TP + SP, 1F1B with a tied embedding) where the
student's fix goes in, and answers turned into data. It imports none of the lesson's finders
(`dlcourse.debug.divergence`, `compare`, `hang`) and no reference: under `dlcourse grade` it
is what a rank loads of the set, with the catalogue and the runs it needs
(`dlcourse.debug.bugs`, `subjects`, `capture`: `answers.ANSWERS.rank_side`, refused there while the
student's code runs); the references and the finders run in the checking process.
"""

from unittest import mock

import torch.distributed as dist

from dlcourse.collectives.counter import CommCounter
from dlcourse.debug.bugs import CATALOGUE
from dlcourse.debug.capture import gradients_shown, intercept_step
from dlcourse.debug.subjects import DebugConfig, grid_subject
from dlcourse.models import GPTConfig
from dlcourse.parallel.combine import GridPlan
from dlcourse.parallel.grid import RankGrid

STEPS = 2  # AdamW steps of every run
BUG = "pp_tied_embeddings_unsynced"
MICRO_BATCHES = 4  # >= the stages (1F1B keeps them busy); one sequence each of the 4


# ---------------------------------------------------------------- a run, and the fix in it


def sp_config(world_size, seed):
    """The debug GPT, cut into `world_size` tensor-parallel ranks: heads, width, vocabulary and
    sequence divisible by it; weights and data from `seed`."""
    model = GPTConfig(vocab_size=32 if world_size == 2 else 33, seq_len=4 * world_size,
                      n_layers=2, n_heads=world_size, hidden=8 * world_size)
    return DebugConfig(model=model, seed=seed, steps=STEPS)


def train(subject, cfg, x, y, fix):
    steps, grads = [], {}

    def before():  # between backward and the optimizer step
        if fix is not None:
            fix()
        with gradients_shown(subject.modules):
            grads.update({n: t.detach().clone() for n, t in subject.full_parameters().items()})
    intercept_step(subject.optimizer, before)
    for _ in range(cfg.steps):
        grads = {}
        subject.train_step(x, y)
        params = {n: t.detach().clone() for n, t in subject.full_parameters().items()}
        steps.append((grads, params))
    return steps


def fix_in_rank(student, world_size, seed):
    """Runs in every rank: TP + SP with the bug on, the student's fix before every step."""
    cfg = sp_config(world_size, seed)
    x, y = cfg.data()
    with CATALOGUE["sp_layernorm_grads"].patch():
        subject = grid_subject(GridPlan(RankGrid(tp=world_size), sequence_parallel=True), cfg)
    model = subject.modules[0]
    partial = [n for n, p in model.named_parameters() if getattr(p, "sequence_partial", False)]
    received = []

    def counted():  # the bytes each call brings this rank by torch.distributed (not its sends)
        with CommCounter() as comm:
            student(model, dist.group.WORLD)
        received.append(sum(r.nbytes for r in comm.records if r.op != "send"))

    need = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n in partial)
    return train(subject, cfg, x, y, fix=counted), partial, received, need


# ---------------------------------------------------------------- the tied embedding


def pp_config(n_stages, seed):
    """The debug GPT with 3 blocks (one a stage on 3 stages), weights and data from `seed`."""
    model = GPTConfig(vocab_size=32, seq_len=8, n_layers=3, n_heads=2, hidden=16)
    return DebugConfig(model=model, seed=seed, steps=STEPS)


def pp_plan(n_stages, dp=1):
    """n_stages of 1F1B, each replicated dp times (each replica its 4 / dp sequences)."""
    return GridPlan(RankGrid(pp=n_stages, dp=dp), micro_batches=MICRO_BATCHES // dp)


def tied_in_rank(student, n_stages, seed, dp=1):
    """Runs in every rank: 1F1B with the bug on, the student's exchange where the bug took
    lesson 06's out. Returns (the run's steps, the bytes each call brought to this rank by
    torch.distributed (all but its sends), a copy's gradient's bytes if this rank holds one)."""
    cfg = pp_config(n_stages, seed)
    x, y = cfg.data()
    site, name, _ = CATALOGUE[BUG].patches[0]  # (executor, "sync_tied_grads", the bug's no-op)
    received = []

    def counted(stages, group=None):
        with CommCounter() as comm:
            student(stages, group)
        received.append(sum(r.nbytes for r in comm.records if r.op != "send"))

    with CATALOGUE[BUG].patch(), mock.patch.object(site, name, counted):
        subject = grid_subject(pp_plan(n_stages, dp), cfg)
        copy = next((p for s in subject.modules for p in copies_of(s)), None)
        need = copy.numel() * copy.element_size() if copy is not None else 0
        return train(subject, cfg, x, y, fix=None), received, need


def copies_of(stage):
    return ([stage.tok_emb.weight] if stage.is_first else []) + \
        ([stage.lm_head.weight] if stage.is_last else [])



# ---------------------------------------------------------------- answers as data


def answer_as_data(student, case):
    """In the rank: the student's answer, its place as a tuple if it came as an object with
    step, phase and name (a dataclass), as a graded submission's rank sends back data only."""
    got = student(case)
    if isinstance(got, dict) and "place" in got:
        return dict(got, place=place_as_data(got["place"]))
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return place_as_data(got[0]), got[1]
    return got


def place_as_data(got, *args):
    """`call_in_process(answer=...)`: an object with step, phase and name (a dataclass) as the
    tuple it means, made where it was returned: a graded submission's rank sends back data only."""
    if got is not None and not isinstance(got, (tuple, list, dict)) \
            and all(hasattr(got, k) for k in ("step", "phase", "name")):
        return got.step, got.phase, got.name
    return got
