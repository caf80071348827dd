"""Choosing a layout (lesson 07): every valid layout estimated, the ones that fit ranked by cost,
the simplest one close to the cheapest recommended, and, when nothing fits, what would.

    p = plan(Workload(REAL_MODELS["Llama-2 7B"], 4096, 4 * 2**20), Cluster(gpu("h100"), 64))
    print(format_plan(p))

Simplicity counts the techniques a layout combines (`techniques`): one for each model-parallel
axis (tp, pp, cp; plain data parallelism is the baseline), one for each state ZeRO shards (stage 1 the optimizer; 2 also the gradients,
reduce-scattered at every micro-batch; 3 also the parameters, gathered at every micro-batch),
one for interleaving and one for recomputation. Fewer is simpler to run, debug and explain.

The decision respects the planner's own error. Its throughput is off by as much as its spread
on the published runs (`bands.error_band`), so two layouts whose predicted costs lie
within that band of each other tie: the planner cannot tell which is cheaper. Among the
layouts that tie with the cheapest, the simplest is recommended (the cheaper among equally
simple ones), and `why` says in numbers why it beat the runner-up. For a mixture of experts
the band is the planner's spread on the published MoE runs, named misses aside
(`moe_band.py`, lesson 09): among the layouts that tie, those whose expert GEMMs are as large
as the runs' it gets right come first, and the plan names the misses and whether the
recommended layout lies in their regime.
"""

from dataclasses import dataclass, field, replace

from dlcourse.planner import margin, moe_band
from dlcourse.planner.bands import band_source, cost_band, is_moe, tie_band, trust
from dlcourse.planner.failures import cost_at_scale, goodput_line, with_failures
from dlcourse.planner.estimate import estimate
from dlcourse.planner.hardware import GPUS, PRICE_CAVEAT, Cluster
from dlcourse.planner.layouts import layouts
from dlcourse.planner.moe_estimate import moe_estimate

ZERO_SHARDS = ["ZeRO: the optimizer state sharded",
               "ZeRO-2: gradients reduce-scattered at every micro-batch",
               "ZeRO-3: parameters gathered at every micro-batch"]


def techniques(layout):
    """What `layout` combines beyond one GPU or plain data parallelism, one name each."""
    axes = [f"{name} {size}" for name, size in (("tp", layout.tp), ("pp", layout.pp),
                                                 ("cp", layout.cp),
                                                 ("ep", getattr(layout, "ep", 1))) if size > 1]
    used = axes + ZERO_SHARDS[:layout.zero_stage]  # plain dp is the baseline: no technique
    used += [f"interleaving (v {layout.interleave})"] if layout.interleave > 1 else []
    return used + ([f"{layout.recompute} recomputation"] if layout.recompute != "none" else [])


def simplicity(layout):
    """How many techniques `layout` combines (0: one GPU, or plain data parallel)."""
    return len(techniques(layout))


@dataclass
class Plan:
    work: object
    cluster: Cluster
    ranked: list  # Estimates that fit, cheapest first (simpler first among equals)
    smallest: object = None  # the Estimate needing the least memory (to explain a miss)
    advice: list = field(default_factory=list)  # what would fit, when nothing does
    failures: object = None  # goodput.py's FailureCost in tokens/s and $, None if left out

    @property
    def cheapest(self):
        return self.ranked[0] if self.ranked else None

    @property
    def tied(self):
        """The layouts whose cost lies within the planner's error (`tie_band`) of the cheapest,
        in the order the decision takes them: for a mixture of experts those the published
        runs back first (`moe_band.trust`), then simplest first, then cheapest."""
        if not self.ranked:
            return []
        limit = self.cheapest.dollars_per_m_tokens * (1 + tie_band(self.work))
        near = [e for e in self.ranked if e.dollars_per_m_tokens <= limit]
        return sorted(near, key=lambda e: (trust(self.work, e.layout), simplicity(e.layout),
                                           e.dollars_per_m_tokens))

    @property
    def recommended(self):
        """The simplest layout that ties with the cheapest (the cheaper among equals; for an
        MoE, of those the published runs back best, `tied`)."""
        return self.tied[0] if self.ranked else None

    @property
    def runner_up(self):
        """The next in the decision's order: the second of the tie, or the cheapest other."""
        tied = self.tied
        if len(tied) > 1:
            return tied[1]
        return next((e for e in self.ranked if e is not self.recommended), None)


def estimate_any(work, layout, cluster):
    """A dense model's `estimate`, or a mixture of experts' `moe_estimate` (lesson 09), which
    adds the experts' terms to the dense ones."""
    return (moe_estimate if is_moe(work) else estimate)(work, layout, cluster)


def plan(work, cluster, advise=True, include_failures=True, **choices):
    """Estimate every valid layout of `work` on `cluster` (`choices` narrow `layouts`'s); their
    tokens/s and $ include failures (`failures.py`) unless include_failures=False."""
    cost = cost_at_scale(work, cluster, include_failures)
    estimates = [with_failures(estimate_any(work, L, cluster), cost)
                 for L in layouts(work, cluster, **choices)]
    if not estimates:
        raise ValueError(f"no layout of {cluster.n_gpus} GPUs splits a batch of "
                         f"{work.sequences:,} sequences of {work.model.name}: every layout needs "
                         "dp x micro-batch x micro-batches = the sequences, at least pp "
                         "micro-batches, and tp within a node; use a larger batch or fewer GPUs")
    fitting = sorted((e for e in estimates if e.fits),
                     key=lambda e: (e.dollars_per_m_tokens, simplicity(e.layout)))
    result = Plan(work, cluster, fitting, min(estimates, key=lambda e: e.memory), failures=cost)
    if not fitting and advise:
        result.advice = what_would_fit(work, cluster, **choices)
    return result


def what_would_fit(work, cluster, **choices):
    """Sentences naming the fewest GPUs of this type, and the GPU types at this count, that
    would fit `work` (searched up to 16 times the GPUs)."""
    advice = []
    for factor in (2, 4, 8, 16):
        bigger = replace(cluster, n_gpus=cluster.n_gpus * factor)
        if _fits_somehow(work, bigger, choices):
            advice.append(f"{bigger.n_gpus} {cluster.gpu.name} GPUs would fit")
            break
    for name, other in GPUS.items():
        if other.memory > cluster.gpu.memory and _fits_somehow(work, replace(cluster, gpu=other),
                                                               choices):
            advice.append(f"{cluster.n_gpus} {name} GPUs ({other.memory / 1e9:.0f} GB) would fit")
    return advice or ["nothing up to 16 times the GPUs fits: use a smaller model or shorter "
                      "sequences"]


def _fits_somehow(work, cluster, choices):
    try:
        return bool(plan(work, cluster, advise=False, **choices).ranked)
    except ValueError:  # no layout splits the batch on that many GPUs
        return False


def format_plan(p, top=8, out=None):
    """The ranked table as text: layout, GB per GPU, step time, tokens/s, MFU, $ per M tokens,
    simplicity; then the recommendation, or why nothing fits."""
    gpu = p.cluster.gpu
    head = (f"{p.work.model.name}, {p.work.batch_tokens:,} tokens a step of {p.work.seq_len} "
            f"tokens each, on {p.cluster.n_gpus} x {gpu.name} ({gpu.memory / 2 ** 30:.1f} GiB = "
            f"{gpu.memory / 1e9:.1f} GB, "
            f"${gpu.price:g}/GPU-hour)")
    if not p.ranked:
        least = p.smallest
        return "\n".join([head, f"Nothing fits: the layout needing least memory "
                                f"({least.layout.describe()}) needs {least.memory / 1e9:.1f} GB a "
                                f"GPU, and with the margin a real GPU needs "
                                f"({memory_line(least, gpu)}) that is more than it has.",
                          *(f"- {a}" for a in p.advice)])
    rows = [("layout", "GB/GPU", "step s", "bubble", "tokens/s", "MFU", "$/M tok",
             "simplicity")]
    for e in p.ranked[:top]:
        rows.append((e.layout.describe(), f"{e.memory / 1e9:.1f}", f"{e.step_time:.2f}",
                     f"{e.bubble:.0%}", f"{e.tokens_per_s:,.0f}", f"{e.mfu:.0%}",
                     f"{e.dollars_per_m_tokens:.3f}", str(simplicity(e.layout))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths))) for r in rows]
    r = p.recommended
    low, high = cost_band(r, p.work)
    return "\n".join([head, f"{len(p.ranked)} layouts fit; the {min(top, len(p.ranked))} "
                            "cheapest (GB/GPU: the tensors counted at the peak; bubble: the "
                            "pipeline's idle share of the step, lesson 06):", *lines,
                      goodput_line(p.failures),
                      f"Recommended: {r.layout.describe()}, ${r.dollars_per_m_tokens:.3f} per "
                      f"million tokens (${low:.3f} to ${high:.3f}: the planner's error on "
                      f"{band_source(p.work)}), {r.mfu:.0%} MFU",
                      *(moe_band.band_lines(p.work, r.layout) if is_moe(p.work) else []),
                      *why(p), f"({PRICE_CAVEAT})"])


def memory_line(e, gpu):
    """The memory of an Estimate with the margin a real GPU leaves (`margin.py`), in GB."""
    parts = margin.margin_parts(gpu, e.layout, e.memory)
    total = e.memory + sum(parts.values())
    listed = " + ".join(f"{what} {b / 1e9:.1f}" for what, b in parts.items())
    return (f"{e.memory / 1e9:.1f} GB counted + {listed} = {total / 1e9:.1f} of "
            f"{gpu.memory / 1e9:.1f} GB")


TERMS = {"compute (bubble included)": "compute_time", "tp all-reduces": "tp_time",
         "cp gathers": "cp_time", "ep all-to-alls": "ep_time", "pp sends": "pp_time",
         "dp / ZeRO traffic": "dp_time",
         "Adam's step": "optimizer_time"}


def why(p):
    """Lines that say why the recommendation beat the runner-up: tie or not, the techniques
    each combines, the step-time term that differs most, and the memory with its margin."""
    r, other = p.recommended, p.runner_up
    gpu = p.cluster.gpu
    lines = [f"  memory: {memory_line(r, gpu)} (margin: CUDA context, NCCL buffers, the "
             "allocator's reserve; planner/margin.py)"]
    if other is None:
        return lines + ["  the only layout that fits"]
    lines += _passed_over(p)
    gap = other.dollars_per_m_tokens / r.dollars_per_m_tokens - 1
    band = tie_band(p.work)
    of = f"{band:.0%}" + (" on the MoE runs" if is_moe(p.work) else "")
    lines.append(f"  runner-up: {other.layout.describe()}, ${other.dollars_per_m_tokens:.3f} "
                 f"({gap:+.1%})")
    if abs(gap) <= band:
        lines.append(f"  they tie: {abs(gap):.1%} apart, inside the planner's error of "
                     f"{of}; " + _simpler_or_backed(p.work, r, other))
    else:
        lines.append(f"  it is cheaper by more than the planner's error ({of})")
    name, attr = max(TERMS.items(), key=lambda kv: abs(getattr(other, kv[1]) -
                                                       getattr(r, kv[1])))
    a, b = getattr(r, attr), getattr(other, attr)
    lines.append(f"  the term that differs most: {name}, {a:.3f} s against {b:.3f} s "
                 f"({b - a:+.3f} s, {(b - a) / r.step_time:+.0%} of the recommended step)")
    return lines


def _backed(work, r, other, name="runner-up"):
    """Why `r` beat `other` on what the runs back (an MoE's `moe_band.backed_better`)."""
    return moe_band.backed_better(work, r.layout, other.layout, name) if is_moe(work) else None


def _passed_over(p):
    """A line when the cheapest layout was not taken because the runs back it less."""
    r, cheapest = p.recommended, p.cheapest
    if cheapest is r or cheapest is p.runner_up or not _backed(p.work, r, cheapest):
        return []
    gap = cheapest.dollars_per_m_tokens / r.dollars_per_m_tokens - 1
    return [f"  the cheapest, {cheapest.layout.describe()}, ${cheapest.dollars_per_m_tokens:.3f} "
            f"({gap:+.1%}), is not taken: the runs back the recommended better, "
            + _backed(p.work, r, cheapest, "cheapest")]


def _simpler_or_backed(work, r, other):
    backed = _backed(work, r, other)
    if backed:
        return "the runs back it better: " + backed
    return _simpler(techniques(r.layout), techniques(other.layout))


def _simpler(mine, theirs):
    if len(mine) == len(theirs):
        return (f"equally simple ({len(mine)} technique{'s' * (len(mine) != 1)}), so the cheaper is taken, a choice "
                "the planner cannot back")
    extra = [t for t in theirs if t not in mine] or theirs
    return (f"the simpler wins: {len(mine)} techniques against {len(theirs)} (the runner-up "
            f"adds {', '.join(extra)})")


def pareto(points):
    """The points no other point beats on both time and cost: [(time, cost, label)] sorted by
    time. A point is dropped when another is at least as fast and at least as cheap."""
    front = []
    for t, c, label in sorted(points, key=lambda p: (p[0], p[1])):
        if not front or c < front[-1][1]:
            front.append((t, c, label))
    return front


def terms(e):
    """One line: a layout's memory and its step time split into the planner's terms."""
    return (f"{e.layout.describe():34} {e.memory / 1e9:5.1f} GB, step {e.step_time:6.3f} s = "
            f"compute {e.compute_time:6.3f} (bubble {e.bubble:.0%} of the step) + tp "
            f"{e.tp_time:5.3f}" + (f" + cp {e.cp_time:5.3f}" if e.cp_time else "")
            + (f" + ep all-to-alls {e.ep_time:5.3f}" if e.ep_time else "")
            + f" + pp sends {e.pp_time:5.3f} + dp {e.dp_time:5.3f} + Adam "
            f"{e.optimizer_time:5.3f}; ${e.dollars_per_m_tokens:.3f}/M tokens")


RIVALS = {  # what the recommended layout is set against: the best layout of each family
    "best with tp > 1": lambda L: L.tp > 1,
    "best with pp > 1": lambda L: L.pp > 1,
    "best without ZeRO": lambda L: L.zero_stage == 0,
    "best without recompute": lambda L: L.recompute == "none",
}


def explain(p):
    """Why the recommendation wins: its terms, then those of the cheapest layout of each
    family it is not in, with how much more each costs."""
    r = p.recommended
    lines = [f"recommended             {terms(r)}"]
    for label, keep in RIVALS.items():
        rival = next((e for e in p.ranked if keep(e.layout)), None)
        if rival is not None and rival is not r and not keep(r.layout):
            extra = rival.dollars_per_m_tokens / r.dollars_per_m_tokens - 1
            lines.append(f"{label:23} {terms(rival)} ({extra:+.0%})")
    return "\n".join(lines)
