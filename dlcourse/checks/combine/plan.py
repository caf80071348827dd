"""Checks for lesson 07's exercises on the planner's arithmetic (exported by `__init__.py`, where
the grader cells find them): a grid rank's model state, a million tokens' cost, the layout.

    check_grid_state_bytes(grid_state_bytes)
    check_cost_per_million_tokens(cost_per_million_tokens)
    check_best_layout(best_layout)

Cases are drawn afresh on every run (`core.fresh_cases`): dp, tp and pp from 1 to 64 (all
different, so a division on the wrong axis shows), ZeRO stages 0-3 in both precisions, compute
times from milliseconds to minutes on pipelines of 1 to 16 stages (the bubble, lesson 06's idle
share of the step, must be paid for), 16 to 4096 GPUs, prices, and three layouts arranged so
that the cheapest does not fit, the fastest that fits is not the cheapest, the least compute is
not the cheapest once its bubble is counted, one fits exactly at the budget, or none fits. The
references are the arithmetic written out here; the planner (`dlcourse.planner`) is refused while
the student's function runs, and lesson 01's `model_state_bytes` (`answers.py`).
"""

import math
import numbers

from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind
from dlcourse.checks.combine.answers import ANSWERS

SECONDS_PER_HOUR = 3600
CASES = 8

# ---------------------------------------------------------------- exercise 4: bytes per rank

STATE_HINT = ("tp and pp each cut the parameters: a rank holds Ψ / (tp pp) of them; ZeRO then "
              "divides the parts its stage partitions by dp, the replicas of that piece")
PER_PARAMETER = {True: (2, 2, 12), False: (4, 4, 8)}  # (parameters, gradients, optimizer state)


def reference_state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision):
    """Bytes one rank holds: its 1/(tp pp) piece, each part divided by dp if partitioned."""
    piece = n_params / (tp * pp)
    parts = zip(("params", "grads", "optimizer"), PER_PARAMETER[mixed_precision])
    partitioned = ("optimizer", "grads", "params")[:zero_stage]
    return sum(b * piece / (dp if part in partitioned else 1) for part, b in parts)


@fresh_cases
def check_grid_state_bytes(grid_state_bytes, *, rng):
    """grid_state_bytes(n_params, dp, tp, pp, zero_stage, mixed_precision) must return the
    model-state bytes of one rank (Ψ / N formulas, no padding)."""
    __tracebackhide__ = True
    expect_callable(grid_state_bytes, "grid_state_bytes")
    cases = [(z, mixed) for z in range(4) for mixed in (True, False)]
    rng.shuffle(cases)
    for zero, mixed in cases:
        while True:
            sizes = [rng.choice((1, 2, 3, 4, 8, 16, 64)) for _ in range(3)]  # dp, tp, pp
            if _telling(sizes, zero):
                break
        args = (rng.randrange(10**6, 10**11), *sizes, zero, mixed)
        where = ("grid_state_bytes(n_params={:,}, dp={}, tp={}, pp={}, zero_stage={}, "
                 "mixed_precision={})".format(*args))
        got = call_in_process(grid_state_bytes, args, exercise="grid_state_bytes", where=where,
                              guard=ANSWERS.in_process, hint=STATE_HINT)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of bytes", STATE_HINT)
        want = reference_state_bytes(*args)
        if not math.isclose(got, want, rel_tol=1e-9):  # float division in another order
            fail(where, None, f"returned {got:,.1f} bytes per rank, expected {want:,.1f}",
                 _state_hint(got, args))
    print(f"grid_state_bytes: passed on {len(cases)} grids (ZeRO stages 0-3, mixed precision "
          "and fp32, dp, tp and pp from 1 to 64)")


def _telling(sizes, zero):
    """dp, tp, pp that tell the mistakes apart: all different, none the product of the other
    two, and with ZeRO both dp and tp above 1 (so sharding over the wrong one shows)."""
    dp, tp, pp = sizes
    products = (dp == tp * pp, tp == dp * pp, pp == dp * tp)
    return len(set(sizes)) == 3 and not any(products) and (not zero or min(dp, tp) > 1)


def _state_hint(got, args):
    n, dp, tp, pp, zero, mixed = args
    zero_on_tp = reference_state_bytes(n, tp, tp, pp, zero, mixed)  # the shards cut by tp
    if zero and math.isclose(got, zero_on_tp, rel_tol=1e-9):  # stage 0 divides nothing by dp
        return ("that divides by tp where ZeRO divides: ZeRO shards over the dp replicas of a "
                "piece, and tp already cut every weight into tp different slices")
    if math.isclose(got, reference_state_bytes(n, dp, tp, 1, zero, mixed), rel_tol=1e-9):
        return "a pipeline stage holds 1/pp of the layers: divide by pp too"
    if math.isclose(got, reference_state_bytes(n, dp, 1, pp, zero, mixed), rel_tol=1e-9):
        return "tensor parallelism cuts every weight into tp slices: divide by tp too"
    return STATE_HINT


# ---------------------------------------------------------------- exercise 5: $ per M tokens

COST_HINT = ("the step lasts longer than its compute: lesson 06's bubble (p - 1)/(m + p - 1) is "
             "the idle share of the step, so step = compute / (1 - bubble); a step costs "
             "n_gpus x price per GPU-hour x its hours (seconds / 3600); divide by the step's "
             "tokens in millions")


def reference_step(compute_time_s, n_stages, n_micro):
    """The step of a pipeline whose ranks would need compute_time_s without idling: the bubble
    is (p - 1)/(m + p - 1) of the step (lesson 06), so the step is the busy time over the rest."""
    return compute_time_s / (1 - (n_stages - 1) / (n_micro + n_stages - 1))


def reference_cost(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
                   price_per_gpu_hour):
    step = reference_step(compute_time_s, n_stages, n_micro)
    dollars_per_step = n_gpus * price_per_gpu_hour * (step / SECONDS_PER_HOUR)
    return dollars_per_step * 1_000_000 / tokens_per_step


def draw_cost_case(rng, pipelined=True):
    """(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus, price_per_gpu_hour); with
    a pipeline of 2 to 16 stages and 1 to 64 micro-batches unless `pipelined` is False."""
    p = rng.choice((2, 3, 4, 8, 16)) if pipelined else 1
    m = rng.randint(1, 64) if p > 1 else rng.randint(1, 8)
    return (round(rng.uniform(0.01, 120.0), 3), p, m,
            rng.randrange(1, 64) * 2 ** rng.randrange(10, 23),
            rng.choice((16, 64, 512, 4096)), round(rng.uniform(0.3, 6.0), 2))


@fresh_cases
def check_cost_per_million_tokens(cost_per_million_tokens, *, rng):
    """cost_per_million_tokens(compute_time_s, n_stages, n_micro, tokens_per_step, n_gpus,
    price_per_gpu_hour) must return the dollars that training on one million tokens costs,
    the pipeline's bubble included."""
    __tracebackhide__ = True
    expect_callable(cost_per_million_tokens, "cost_per_million_tokens")
    for i in range(CASES):
        args = draw_cost_case(rng, pipelined=i != 1)  # one case without a pipeline
        where = ("cost_per_million_tokens(compute_time_s={}, n_stages={}, n_micro={}, "
                 "tokens_per_step={:,}, n_gpus={}, price_per_gpu_hour={})".format(*args))
        got = call_in_process(cost_per_million_tokens, args, exercise="cost_per_million_tokens",
                              where=where, guard=ANSWERS.in_process, hint=COST_HINT)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(where, None, f"returned {kind(got)}, expected a number of dollars", COST_HINT)
        want = reference_cost(*args)
        if not math.isclose(got, want, rel_tol=1e-9):  # the same arithmetic in another order
            fail(where, None, f"returned ${got:.6g}, expected ${want:.6g} per million tokens",
                 _cost_hint(got, want, args))
    print(f"cost_per_million_tokens: passed on {CASES} cases (pipelines of 1 to 16 stages, "
          "0.01 s to 2 min of compute, 16 to 4096 GPUs)")


def _cost_hint(got, want, args):
    """Name the mistake by the factor between the answers."""
    compute, p, m = args[:3]
    bubble = (p - 1) / (m + p - 1)
    if p > 1 and math.isclose(got, want * (1 - bubble), rel_tol=1e-9):
        return ("that is the cost of the compute alone: the pipeline idles a share (p - 1)/(m + "
                "p - 1) of the step, and the idle GPUs are paid for too")
    if p > 1 and math.isclose(got, want * (1 - bubble) * (1 + bubble), rel_tol=1e-9):
        return ("the bubble is a share of the step, not of the compute: step x (1 - bubble) = "
                "compute, so step = compute / (1 - bubble)")
    known = {1e-6: "that is the cost of one token: a million tokens cost 1,000,000 times more",
             1e6: "that is a million times too much: divide by the tokens in millions, "
                  "tokens_per_step / 1e6",
             SECONDS_PER_HOUR: "the step time is in seconds and the price per hour: divide the "
                               "seconds by 3600, do not multiply",
             1 / SECONDS_PER_HOUR: "the step time is in seconds and the price per hour: convert "
                                   "the seconds to hours (/ 3600) once",
             SECONDS_PER_HOUR ** 2: "the step time is in seconds and the price per hour: divide "
                                    "the seconds by 3600, do not multiply"}
    for factor, says in known.items():
        if math.isclose(got, want * factor, rel_tol=1e-9):
            return says
    return COST_HINT


# ---------------------------------------------------------------- exercise 6: the best layout

BEST_HINT = ("drop every layout whose bytes_per_gpu exceed the budget; of the rest, return the "
             "name of the one with the lowest cost per million tokens, its bubble included "
             "(None if none is left)")
LEAST_HINT = ("that layout has the least compute, but its pipeline idles: the step is the compute "
              "/ (1 - bubble), and the idle GPUs are paid for too")
FASTEST_HINT = ("that is the fastest step, not the cheapest: the cost counts every GPU, so a "
                "layout on more GPUs can be faster and still cost more per token")


def _cost_of(c, price, tokens):
    return reference_cost(c["compute_time_s"], c["n_stages"], c["n_micro"], tokens, c["n_gpus"],
                          price)


def reference_best(candidates, memory_budget, price_per_gpu_hour, tokens_per_step):
    fitting = [c for c in candidates if c["bytes_per_gpu"] <= memory_budget]
    if not fitting:
        return None
    return min(fitting, key=lambda c: _cost_of(c, price_per_gpu_hour, tokens_per_step))["name"]


def draw_best_case(rng, kind_):
    """Three layouts and a budget. kind_: "cheapest_too_big" (the cheapest of all needs more
    memory than the budget), "fastest_not_cheapest" (of those that fit, the fastest uses so many
    more GPUs that it costs more), "bubble_decides" (by compute alone a pipelined layout looks
    cheapest; its bubble makes it the dearest), "exact" (the answer needs exactly the budget),
    "none". Each layout's step is drawn first; its compute is the step less its bubble."""
    budget = rng.choice((24, 40, 48, 80, 141)) * 10**9
    gpus = rng.sample((8, 16, 32, 64, 128), 3)
    names = [_layout_name(rng, g) for g in gpus]  # different GPU counts: different names
    step = {n: rng.uniform(0.5, 20.0) for n in gpus}
    cand = [{"name": name, "n_gpus": g, "bytes_per_gpu": rng.uniform(0.3, 0.95) * budget,
             "n_stages": _stages(name), "n_micro": 4 * rng.randint(1, 8), "step": step[g]}
            for name, g in zip(names, gpus)]
    costs = sorted(cand, key=lambda c: c["n_gpus"] * c["step"])
    if kind_ == "cheapest_too_big":
        costs[0]["bytes_per_gpu"] = rng.uniform(1.01, 1.5) * budget
    elif kind_ == "fastest_not_cheapest":  # B on more GPUs: faster, and u times A's cost
        a, b = sorted(cand[:2], key=lambda c: c["n_gpus"])  # b has at least twice a's GPUs
        u = rng.uniform(1.1, 1.5)
        b["step"] = a["step"] * a["n_gpus"] / b["n_gpus"] * u  # < 0.75 a's
        c = cand[2]  # slower than a and dearer than both
        c["step"] = max(1.2 * a["step"], 2 * u * a["n_gpus"] * a["step"] / c["n_gpus"])
    elif kind_ == "bubble_decides":
        _bubble_decides(rng, costs)
    elif kind_ == "exact":
        costs[0]["bytes_per_gpu"] = float(budget)
    else:
        for c in cand:
            c["bytes_per_gpu"] = rng.uniform(1.01, 3.0) * budget
    for c in cand:  # what the student sees: the compute, not the step
        c["compute_time_s"] = c.pop("step") * (1 - _bubble(c))
    return cand, budget, round(rng.uniform(0.5, 5.0), 2), 2 ** rng.randrange(19, 23)


def _bubble(c):
    p, m = c["n_stages"], c["n_micro"]
    return (p - 1) / (m + p - 1)


def _bubble_decides(rng, by_cost):
    """Two layouts without a pipeline, the second 5-50% dearer than the first, and a deep
    pipeline with few micro-batches (bubble 7/11 of the step) whose compute alone, GPU for GPU,
    is the least of the three: only its bubble makes it the dearest."""
    cheap, middle, dear = by_cost
    for c, factor in ((cheap, 1.0), (middle, rng.uniform(1.05, 1.5))):
        c["n_stages"], c["name"] = 1, f"dp{c['n_gpus']} tp1 pp1"
        c["step"] = cheap["n_gpus"] * cheap["step"] * factor / c["n_gpus"]
    dear["n_stages"], dear["n_micro"], dear["name"] = 8, 4, f"dp{dear['n_gpus'] // 8} tp1 pp8"
    compute = rng.uniform(0.8, 0.95) * cheap["n_gpus"] * cheap["step"]  # GPU-seconds
    dear["step"] = compute / dear["n_gpus"] / (1 - _bubble(dear))  # 11/4 of it: the dearest


def _stages(name):
    return int(name.split("pp")[1].split()[0])


def _layout_name(rng, n_gpus):
    """'dp4 tp8 pp2 zero1': a layout of n_gpus GPUs, as the planner's table names them."""
    tp, pp = rng.choice([(t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4) if t * p <= n_gpus])
    dp = n_gpus // (tp * pp)  # n_gpus and tp pp are powers of 2: dp tp pp = n_gpus
    return f"dp{dp} tp{tp} pp{pp}" + (f" zero{rng.choice((1, 3))}" if dp > 1 and pp == 1 and
                                      rng.random() < 0.5 else "")


@fresh_cases
def check_best_layout(best_layout, *, rng):
    """best_layout(candidates, memory_budget, price_per_gpu_hour, tokens_per_step) must return
    the name of the cheapest candidate that fits the budget, or None if none fits."""
    __tracebackhide__ = True
    expect_callable(best_layout, "best_layout")
    kinds = ["cheapest_too_big", "fastest_not_cheapest", "bubble_decides", "exact", "none"]
    kinds += [rng.choice(kinds[:4]) for _ in range(4)]
    for kind_ in kinds:
        cand, budget, price, tokens = draw_best_case(rng, kind_)
        where = (f"best_layout(three layouts, memory_budget={budget / 1e9:g} GB, "
                 f"price_per_gpu_hour={price}, tokens_per_step={tokens:,})")
        got = call_in_process(best_layout, ([dict(c) for c in cand], budget, price, tokens),
                              exercise="best_layout", where=where, guard=ANSWERS.in_process,
                              hint=BEST_HINT)
        want = reference_best(cand, budget, price, tokens)
        if got != want:
            fail(where, None, f"returned {got!r}, expected {want!r}\n{_table(cand, budget, price, tokens)}",
                 _best_hint(got, cand, budget, price, tokens))
    print(f"best_layout: passed on {len(kinds)} cases (the cheapest too big, the fastest not "
          "the cheapest, a bubble that decides, one exactly at the budget, none fitting)")


def _table(cand, budget, price, tokens):
    rows = [f"  {c['name']:<18} {c['n_gpus']:>4} GPUs  {c['bytes_per_gpu'] / 1e9:7.2f} GB/GPU "
            f"{'fits' if c['bytes_per_gpu'] <= budget else 'too big':>7}  "
            f"{c['compute_time_s']:6.2f} s of compute, {c['n_stages']} stages x "
            f"{c['n_micro']} micro-batches" for c in cand]
    return "the layouts:\n" + "\n".join(rows)


def _best_hint(got, cand, budget, price, tokens):
    by_name = {c["name"]: c for c in cand}
    fitting = [c for c in cand if c["bytes_per_gpu"] <= budget]
    if got is not None and not fitting:
        return "no layout fits the budget: return None"
    if got in by_name and by_name[got]["bytes_per_gpu"] > budget:
        return (f"{got!r} needs {by_name[got]['bytes_per_gpu'] / 1e9:.2f} GB a GPU, more than "
                f"the budget of {budget / 1e9:g} GB: a layout that does not fit cannot run")
    least = min(fitting, key=lambda c: c["n_gpus"] * c["compute_time_s"])["name"]
    fastest = min(fitting, key=lambda c: reference_step(
        c["compute_time_s"], c["n_stages"], c["n_micro"]))["name"]
    said = [hint for name, hint in ((fastest, FASTEST_HINT), (least, LEAST_HINT)) if got == name]
    return "; and ".join(said) or BEST_HINT  # one case may not tell the two apart: both named
