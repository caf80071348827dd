"""Lesson 07, exercise 6 (`exercises/07_combining.ipynb`): `check_best_layout`, of three
layouts the cheapest one that fits the memory budget, or None. The layouts are drawn so that the
cheapest does not fit, the fastest that fits is not the cheapest, the least compute is not the
cheapest once its bubble is counted, one fits exactly at the budget, or none fits; the costs are
`costs.py`'s.
"""

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.combine.costs import reference_cost, reference_step
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases


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
