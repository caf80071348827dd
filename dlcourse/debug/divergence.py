"""The divergence finder: the first place a parallel run parts from one process (lesson 10,
`lessons/10_debugging.ipynb`).

    report = find_divergence("TP + SP (lesson 04)", bug="sp_layernorm_grads")
    print(report)   # first divergence: step 1, gradient of ln_f.weight ... on ranks 0, 1

Every rank trains the plain GPT in one process on the whole batch (the reference), then the
strategy (`subjects.SUBJECTS`) on the same data, recording both the same way (`capture.py`):
the parameters before step 1, then for each step the activations in forward order, the
gradients in the order the reference's backward finished them, the parameters after the step.
The first recorded tensor that differs is where the bug lives: a wrong forward shows in an
activation; a wrong backward or reduction in a gradient (the one nearest the loss first); a
wrong update only in the parameters. Each rank compares its own view, so the report also says
which ranks hold the wrong value. Every step's collectives are counted (lesson 02's
`CommCounter`): a bug that only costs time shows there.
"""

from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

import dlcourse
from dlcourse.collectives.counter import CommCounter
from dlcourse.debug.bugs import CATALOGUE, Bug
from dlcourse.debug.capture import ActivationLog, gradients_shown, intercept_step
from dlcourse.debug.compare import compare_trace
from dlcourse.debug.subjects import SUBJECTS, DebugConfig, Subject
from dlcourse.models import lm_loss
from dlcourse.strategies import CATALOGUE as STRATEGIES
from dlcourse.strategies.trainer import mean_loss

PHASES = ("parameters before step 1", "activations", "gradients", "parameters after the step")


@dataclass
class Divergence:
    step: int  # 1 = the first optimizer step (0: the parameters before it)
    phase: str  # one of PHASES
    name: str  # module (activations) or parameter name, as the plain GPT names it
    diff: float  # the largest |parallel - reference| over the ranks that differ
    scale: float  # the largest |reference| value there, to read diff against
    ranks: list  # the ranks whose value differs

    def __str__(self):
        where = self.phase if self.step == 0 else f"step {self.step}, {self.phase}"
        what = {"activations": "output of", "gradients": "gradient of"}.get(self.phase, "parameter")
        ranks = ", ".join(map(str, self.ranks))
        return (f"first divergence: {where}: {what} {self.name}: max |Δ| "
                f"{self.diff:.2e} (reference values up to {self.scale:.2e}) on rank"
                f"{'s' if len(self.ranks) > 1 else ''} {ranks}")


@dataclass
class Report:
    subject: str
    bug: str | None
    first: Divergence | None  # None: every compared tensor matched
    compared: dict  # phase -> how many tensors rank 0 compared
    comm: list  # per rank: {op: calls} of step 1's collectives
    spread: dict = None  # (step, phase) -> how many tensors differ there on some rank
    note: str = ""  # the strategy's own: what the finder cannot compare for it (Strategy.note)

    def __str__(self):
        head = f"{self.subject}" + (f" with bug {self.bug!r}" if self.bug else "")
        checked = ", ".join(f"{self.compared[phase]} {phase}" for phase in PHASES
                            if phase in self.compared)
        ops = ", ".join(f"{n} {op}" for op, n in sorted(self.comm[0].items())) or "none"
        body = str(self.first) if self.first else "no divergence: every compared tensor matches"
        note = f"\n  note: {self.note}" if self.note else ""
        return (f"{head}\n  {body}\n  compared on rank 0: {checked}\n"
                f"  step 1's collectives on rank 0: {ops}{note}")


def record(subject, cfg, x, y):
    """(trace, comm) of cfg.steps steps of `subject`: trace [(step, phase, {name: tensor})] in
    PHASES order, comm one Counter {op: calls} per step (the finder's own gathers left out)."""
    log, grads, counting = ActivationLog(subject.modules), {}, []

    def read_gradients():
        counter = counting[-1] if counting else None
        before = len(counter.records) if counter else 0
        with gradients_shown(subject.modules):
            grads.update(_copies(subject.full_parameters()))
        if counter:
            del counter.records[before:]  # the finder's own gathers are not the strategy's
    intercept_step(subject.optimizer, read_gradients)
    trace, comm = [(0, PHASES[0], _copies(subject.full_parameters()))], []
    for step in range(1, cfg.steps + 1):
        grads.clear()
        with CommCounter() as counter:
            counting.append(counter)
            subject.train_step(x, y)
            counting.pop()
        comm.append(Counter(r.op for r in counter.records))
        trace += [(step, PHASES[1], log.take()), (step, PHASES[2], dict(grads)),
                  (step, PHASES[3], _copies(subject.full_parameters()))]
    log.remove()
    return trace, comm


def _copies(tensors):
    """Copies: a helper may hand back the live parameters (a replicated one, as it is)."""
    return {name: t.detach().clone() for name, t in tensors.items()}


def reference_subject(cfg, strategy):
    """The plain model in one process as a Subject: the whole batch, AdamW, torch's clipping;
    the GPT, or the strategy's own reference (lesson 09's MoE GPT)."""
    model = strategy.reference(cfg) if strategy.reference else cfg.new_model()
    loss_fn = strategy.loss or (lambda model, logits, y: lm_loss(logits, y))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    order = []
    for name, p in model.named_parameters():  # the order backward finishes the gradients
        p.register_post_accumulate_grad_hook(lambda p, name=name: order.append(name))

    def train_step(x, y):
        optimizer.zero_grad()
        loss = loss_fn(model, model(x), y)
        loss.backward()
        if cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        return loss.item()
    full = lambda: {n: p.detach().clone() for n, p in model.named_parameters()}  # noqa: E731
    return Subject([model], optimizer, train_step, full), order


def record_pair(name, bug, cfg):
    """On this rank: the one-process reference and the strategy `name` (the bug's patch on, if
    `bug`) trained on the same data; (reference trace, its order, the strategy, its trace, its
    collectives)."""
    x, y = cfg.data()
    reference, order = reference_subject(cfg, SUBJECTS[name])
    ref_trace, _ = record(reference, cfg, x, y)
    with _bug(bug).patch() if bug else nullcontext():
        subject = SUBJECTS[name].build(cfg)
        trace, comm = record(subject, cfg, x, y)
    return ref_trace, order, subject, trace, comm


def compare_on_rank(jobs):
    """Run on every rank: for each (strategy name, bug name or None, DebugConfig), the reference
    and the strategy (the bug's patch on), compared; returns one comparison per job."""
    results = []
    for name, bug, cfg in jobs:
        ref_trace, order, subject, trace, comm = record_pair(name, bug, cfg)
        gaps, compared = compare_trace(ref_trace, trace, order, subject, cfg)
        results.append((gaps, compared, comm[0]))
    return results


def find_divergences(cases, world_size=None, timeout=120):
    """Reports for several (strategy name, bug name or None[, DebugConfig]) cases run in one
    job (one launch: the cheap way to check many). The cases' strategies must share a world size.
    In place of a bug's name a `Bug` of one's own may be given (its patches made importable)."""
    jobs = [job(*case) for case in cases]
    sizes = {SUBJECTS[name].world_size for name, _, _ in jobs}
    if len(sizes) != 1:
        raise ValueError(f"cases need different numbers of ranks {sorted(sizes)}: run each size "
                         "in its own find_divergences call")
    per_rank = dlcourse.launch(compare_on_rank, jobs, world_size=world_size or sizes.pop(),
                               timeout=timeout)
    if len(per_rank) == 1 and dist.is_initialized() and dist.get_world_size() > 1:
        mine, per_rank = per_rank[0], [None] * dist.get_world_size()  # under torchrun
        dist.all_gather_object(per_rank, mine)  # every rank's comparisons, on every rank
    return [_merge(name, bug, [r[i] for r in per_rank]) for i, (name, bug, _) in enumerate(jobs)]


def find_divergence(subject, bug=None, cfg=None, timeout=120):
    """The report of one strategy (a name in SUBJECTS), with a bug of the catalogue switched on."""
    return find_divergences([(subject, bug, cfg)], timeout=timeout)[0]


def losses_on_rank(jobs, n_steps):
    """Run on every rank: for each job, the loss of n_steps steps in one process and with the
    strategy (the bug's patch on), each the mean over the ranks that compute one."""
    curves = []
    for name, bug, cfg in jobs:
        x, y = cfg.data()
        reference, _ = reference_subject(cfg, SUBJECTS[name])
        one = [reference.train_step(x, y) for _ in range(n_steps)]
        with _bug(bug).patch() if bug else nullcontext():
            subject = SUBJECTS[name].build(cfg)
            parallel = [mean_loss(subject.train_step(x, y), cfg) for _ in range(n_steps)]
        curves.append((one, parallel))
    return curves


def loss_curves(cases, n_steps=20, timeout=300):
    """[(one process's losses, the strategy's losses)] of n_steps steps per case, one job for
    all (cases as for `find_divergences`): what a training log would show."""
    jobs = [job(*case) for case in cases]
    sizes = {SUBJECTS[name].world_size for name, _, _ in jobs}
    if len(sizes) != 1:
        raise ValueError(f"cases need different numbers of ranks {sorted(sizes)}")
    return dlcourse.launch(losses_on_rank, jobs, n_steps, world_size=sizes.pop(),
                           timeout=timeout)[0]


def job(name, bug=None, cfg=None):
    """(name, bug, DebugConfig) as a rank runs it (`compare_on_rank`, and lesson 10's exercise
    checks): the strategy and the bug checked against SUBJECTS and the catalogue, the config the
    strategy needs (its world size's) with what the bug needs to show."""
    if name not in SUBJECTS:
        entry = STRATEGIES.get(name)  # in the catalogue but declared finder=False: say why
        raise ValueError(f"{name!r} is no subject of the finder: {entry.note}" if entry else
                         f"unknown strategy {name!r}; choose from {list(SUBJECTS)}")
    if bug is not None and not isinstance(bug, Bug) and bug not in CATALOGUE:
        raise ValueError(f"unknown bug {bug!r}; the catalogue has {list(CATALOGUE)}")
    cfg = cfg or replace(DebugConfig(), **SUBJECTS[name].config)  # what the strategy needs
    if bug is not None:
        cfg = replace(cfg, **_bug(bug).config)  # what the bug needs to show (a clip, ...)
    return name, bug, cfg


def _bug(bug):
    """A name of the catalogue, or a `Bug` of one's own (a test's deliberate perturbation)."""
    return bug if isinstance(bug, Bug) else CATALOGUE[bug]


def _merge(name, bug, results):
    """One report from every rank's (gaps, compared, comm): the earliest gap over the ranks."""
    gaps = [(g, rank) for rank, (rank_gaps, _, _) in enumerate(results) for g in rank_gaps]
    first = None
    if gaps:
        where = min(g["position"] for g, _ in gaps)
        here = [(g, rank) for g, rank in gaps if g["position"] == where]
        g0 = here[0][0]
        first = Divergence(g0["step"], g0["phase"], g0["name"], max(g["diff"] for g, _ in here),
                           max(g["scale"] for g, _ in here), sorted(rank for _, rank in here))
    differing = {(g["step"], g["phase"], g["name"]) for g, _ in gaps}
    spread = Counter((step, phase) for step, phase, _ in differing)
    label = bug.breaks if isinstance(bug, Bug) else bug
    return Report(name, label, first, results[0][1], [dict(c) for _, _, c in results], dict(spread),
                  SUBJECTS[name].note)
