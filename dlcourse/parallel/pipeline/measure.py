"""A schedule's bubble and memory, predicted and measured (lesson 06, `lessons/06_pipeline.ipynb`).

    spans = simulate({r: one_f_one_b(r, 4, 8) for r in range(4)})   # unit times, before a run
    bubble_fraction(spans)                                          # 3/11: idle / (p x step)
    bubble_formula("1F1B", p=4, m=8)                                # (p-1)/(m+p-1) = 3/11

`simulate` plays the action lists with every forward 1 unit, a full backward 2 and (zero bubble)
B and W 1 each, every action starting once its rank is free and its input has arrived: the
schedule drawn before it runs. Those are the times of one stage of a p-stage model; an
interleaved rank holds v chunks of 1/v of a stage each (Narayanan et al. 2021, §2.2.2), so a
chunk's action takes 1/v of them. Measured per-stage times (`stage_times`) replace the units
where the stages are not alike. A real run's `Timeline` gives the same spans, measured.

Memory: a stage keeps each micro-batch's saved activations from its F until its backward (W in
zero-bubble schedules) frees them, so its peak is the most micro-batches in flight at once
(`in_flight_peak`) times the bytes one micro-batch saves (`micro_batch_activation_bytes`).
"""

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn

from dlcourse.collectives.p2p import rank_in
from dlcourse.memory import SavedTensorLog, peak_activations
from dlcourse.models import lm_loss
from dlcourse.parallel.pipeline.executor import input_gradient, run_schedule, split_micro_batches
from dlcourse.parallel.pipeline.stages import cut_stages
from dlcourse.parallel.timeline import Span, Timeline

UNIT_TIMES = {"F": 1.0, "B": 2.0, "B split": 1.0, "W": 1.0}


def simulate(actions_by_rank, times=UNIT_TIMES, stage_times=None):
    """Spans (rank, lane "stage s", name "F3", start, end) of every action, in units of time:
    each starts when its rank is free and what it needs is done (F: the previous stage's F of
    the micro-batch; B: the next stage's B and its own F; W: its own B). `times`: one stage's
    action lengths; with v = stages / ranks > 1 (interleaved) a chunk's are times / v.
    `stage_times`: {stage: {kind: length}}, measured, used as they are. Raises on a deadlock."""
    split = {r: any(a.kind == "W" for a in acts) for r, acts in actions_by_rank.items()}
    n_stages = 1 + max(a.stage for acts in actions_by_rank.values() for a in acts)
    v = n_stages / len(actions_by_rank)  # chunks per rank: 1, or v for interleaved 1F1B
    length = (lambda s, kind: stage_times[s][kind]) if stage_times else \
        (lambda s, kind: times[kind] / v)
    done, spans = {}, []  # (stage, kind, mb) -> end time; the spans drawn
    free = dict.fromkeys(actions_by_rank, 0.0)  # rank -> when it finishes its last action
    nxt = dict.fromkeys(actions_by_rank, 0)  # rank -> index of its next action
    progress = True
    while progress:
        progress = False
        for r, acts in actions_by_rank.items():
            while nxt[r] < len(acts):
                a = acts[nxt[r]]
                needs = _needs(a, n_stages)
                if any(n not in done for n in needs):
                    break  # waits for another rank
                start = max([free[r]] + [done[n] for n in needs])
                kind = "B split" if a.kind == "B" and split[r] else a.kind
                free[r] = done[a.stage, a.kind, a.mb] = start + length(a.stage, kind)
                spans.append(Span(r, f"stage {a.stage}", f"{a.kind}{a.mb}", start, free[r]))
                nxt[r] += 1
                progress = True
    stuck = {r: str(acts[nxt[r]]) for r, acts in actions_by_rank.items() if nxt[r] < len(acts)}
    if stuck:
        raise RuntimeError(f"the schedule deadlocks: ranks wait forever at {stuck}")
    return spans


def stage_times_of(spans):
    """{stage: {kind: median length}} of a run's spans (measured or simulated), for `simulate`:
    what each stage's F, B (and W) really cost, unequal where the stages are."""
    lengths = {}
    for s in spans:
        stage, kind = int(s.lane.split()[-1]), s.name[0]
        lengths.setdefault(stage, {}).setdefault(kind, []).append(s.duration)
    out = {}
    for stage, kinds in lengths.items():
        out[stage] = {kind: statistics.median(ts) for kind, ts in kinds.items()}
        if "W" in kinds:
            out[stage]["B split"] = out[stage]["B"]
    return out


def _needs(action, n_stages):
    s, kind, mb = action
    if kind == "F":
        return [(s - 1, "F", mb)] if s > 0 else []
    if kind == "B":
        return [(s, "F", mb)] + ([(s + 1, "B", mb)] if s < n_stages - 1 else [])
    return [(s, "B", mb)]  # W


def bubble_fraction(spans):
    """Idle share of the step: 1 - busy / (ranks x (last end - first start)), all ranks."""
    ranks = {s.rank for s in spans}
    step = max(s.end for s in spans) - min(s.start for s in spans)
    return 1 - sum(s.duration for s in spans) / (len(ranks) * step)


def bubble_time(spans):
    """Idle time per rank, averaged over the ranks: step - busy / ranks (units or seconds). The
    fraction can fall because the work grew; this cannot."""
    ranks = {s.rank for s in spans}
    step = max(s.end for s in spans) - min(s.start for s in spans)
    return step - sum(s.duration for s in spans) / len(ranks)


def bubble_formula(schedule, p, m, v=1):
    """The bubble as a share of the step, with F, B, W of equal cost (a full backward 2 units).
    GPipe, 1F1B: (p-1)/(m+p-1). Interleaved 1F1B: its bubble is (p-1)/(v m) of the ideal time
    (Narayanan et al.), (p-1)/(v m + p-1) of the step. ZB-H1: (p-1)(F+B-W) idle per rank,
    a third of 1F1B's (p-1)(F+B+W): (p-1)/(3m + p-1), for m >= p."""
    formulas = {
        "naive": lambda: (p - 1) / p,
        "GPipe": lambda: (p - 1) / (m + p - 1),
        "1F1B": lambda: (p - 1) / (m + p - 1),
        "interleaved 1F1B": lambda: (p - 1) / (v * m + p - 1),
        "ZB-H1": lambda: (p - 1) / (3 * m + p - 1),
    }
    return formulas[schedule]()


def bubble_time_formula(schedule, p, v=1, times=UNIT_TIMES):
    """Idle time per rank, in the units of `times` (one stage's F, B, W): (p-1)(F+B) for naive,
    GPipe and 1F1B, whatever m; (p-1)(F+B)/v interleaved (each ramp action is a 1/v chunk);
    (p-1)(F+B-W) for ZB-H1 with B and W split (m >= p)."""
    full = (p - 1) * (times["F"] + times["B"])
    if schedule == "interleaved 1F1B":
        return full / v
    if schedule == "ZB-H1":
        return (p - 1) * (times["F"] + times["B split"] - times["W"])
    return full


def in_flight_peak(actions, stage_bytes=None, kept_for_w=None):
    """The most micro-batches (or, given stage -> bytes per micro-batch, bytes) a rank holds
    activations for at once: from its F until its backward frees them. Zero bubble: B frees
    all but `kept_for_w` (stage -> bytes W still needs; default everything: W frees it all),
    W the rest, Qi et al.'s M_B and M_W."""
    split = any(a.kind == "W" for a in actions)
    held = peak = 0
    for a in actions:
        size = stage_bytes[a.stage] if stage_bytes else 1
        kept = kept_for_w[a.stage] if kept_for_w else size
        if a.kind == "F":
            held += size
            peak = max(peak, held)
        elif a.kind == "B":
            held -= size - kept if split else size
        elif a.kind == "W":
            held -= kept
    return peak


def first_rank_peak_formula(schedule, p, m, v=1):
    """Rank 0's most micro-batches in flight, in units of one whole stage's activations (a
    chunk holds 1/v of them). GPipe m; 1F1B and ZB-H1 min(m, p). Interleaved 1F1B: rank 0 runs
    2(p-1) + (v-1)p warm-up chunk forwards, then one more before its first backward:
    (v p + p - 1) chunks of 1/v = p (1 + (p-1)/(p v)), Korthikanti et al. 2022's factor on 1F1B's
    p, once the warm-up fits in the m v chunk forwards (m >= p + (p-1)/v, so m >= 2p); at m = p
    every forward comes first, m v chunks = p stages. Exact in bytes when each chunk saves 1/v
    of a stage's bytes (alike layers, the embedding's and head's extras left out)."""
    if schedule == "GPipe":
        return m
    if schedule == "interleaved 1F1B":
        return min(m * v, v * p + p - 1) / v
    return min(m, p)  # 1F1B; ZB-H1 (its W's hold rank 0's micro-batches no longer than 1F1B)


def micro_batch_activation_bytes(stage, x, y, n_micro, after_b=False):
    """Bytes autograd saves in one forward of `stage` on one micro-batch (x, y): tokens on the
    first stage; the loss on the last. Other stages get a fresh input like a received one. The
    tokens and targets are not counted: the caller holds the whole batch anyway. after_b: the
    bytes still held after zero bubble's B (`executor.input_gradient`), until W (M_W)."""
    data = (x, y)
    if not stage.is_first:
        dtype = next(stage.parameters()).dtype
        x = torch.zeros(*x.shape, stage.hidden, dtype=dtype, requires_grad=True)
    with SavedTensorLog(stage, ignore=data) as log:
        out = stage(x)
        if stage.is_last:
            out = lm_loss(out, y) / n_micro
        if after_b and not stage.is_first:  # the first stage's B does nothing: W does it all
            dy = None if stage.is_last else torch.ones_like(out)
            for_w = input_gradient(out, dy, x, stage)  # W's starting points: they hold the graph
        held = log.live_bytes()["activations"]
        del out
    return held


def peak_activation_bytes(stages, micro_batches, run):
    """Call `run()` (a step on these stages) with every saved tensor counted (lesson 01's
    SavedTensorLog) but the micro-batches' tokens and targets, which the caller holds for the
    whole step anyway; returns (what run returned, the most activation bytes held at once)."""
    data = [t for pair in micro_batches for t in pair]
    return peak_activations(nn.ModuleList(stages), run, ignore=data)


def timed_step(stages, actions, micro_batches, group=None, unit=None):
    """Run one step of `actions` with every action's start and end recorded; returns this
    rank's Spans (lane "stage s", name "F3"). The ranks start together (a barrier first).
    unit: hold each action to a fixed length (see `executor.Executor`), for a machine with
    fewer cores than ranks, where real compute would measure the machine, not the schedule."""
    timeline = Timeline(dist.get_rank())
    dist.barrier(group)
    run_schedule(stages, actions, micro_batches, group, timeline=timeline, unit=unit)
    for s in stages:
        s.zero_grad()
    return timeline.spans


def measured_bubbles(schedule, gpt, data, n_micros, group=None, v=1, unit=None, repeats=3):
    """{m: (bubble fraction of the median step, that step's spans from every rank)}: the
    schedule run `repeats` times for each m (after one warm-up step, its compute not held), on
    every rank of `group`."""
    rank, p = rank_in(group, "measured_bubbles")
    stages = cut_stages(gpt, group, v)
    out = {}
    for m in n_micros:
        micro = split_micro_batches(*data, m)
        actions = schedule(rank, p, m, *((v,) if v > 1 else ()))
        timed_step(stages, actions, micro, group)  # warm-up (connections, allocator): not held
        runs = []
        for _ in range(repeats):
            spans = [None] * p
            mine = timed_step(stages, actions, micro, group, unit)
            dist.all_gather_object(spans, mine, group=group)
            spans = [span for rank_spans in spans for span in rank_spans]
            runs.append((bubble_fraction(spans), spans))
        out[m] = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    return out
