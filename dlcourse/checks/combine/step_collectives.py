"""Lesson 07, exercise 3 (`exercises/07_combining.ipynb`): `check_step_collectives`, which
collectives one training step issues on which axis; the reference is the table of lessons 03-06
written out per axis (`reference_collectives`), which tests/test_checks_combine_references.py
holds equal to what `combine` issues on 6 ranks, counted at torch's dispatcher.
"""

from dlcourse.checks.combine.answers import ANSWERS
from dlcourse.checks.combine.grids import AXES, CASES, as_axes, draw_grid
from dlcourse.checks.core import call_in_process, expect_callable, fail, fresh_cases, kind


OPS = ("all_reduce", "all_gather", "reduce_scatter", "send", "recv")
COLLECTIVES_HINT = ("an axis of size 1 is a group of one rank: nothing to exchange. Otherwise: "
                    "pp sends and receives, dp all-reduces gradients (ZeRO: reduce-scatter and "
                    "all-gather), tp all-reduces (sequence parallel adds all-gather and "
                    "reduce-scatter, and a pipeline's last stage all-gathers the logits)")


def reference_collectives(dp, tp, pp, zero_stage, sequence_parallel):
    """{axis: set of op names} one training step of lesson 07's `combine` issues."""
    ops = {"pp": set(), "dp": set(), "tp": set()}
    if pp > 1:
        ops["pp"] = {"send", "recv"}  # activations forward, gradients back (and tied grads)
    if dp > 1:
        ops["dp"] = {"reduce_scatter", "all_gather"} if zero_stage else {"all_reduce"}
    if tp > 1:
        ops["tp"] = {"all_reduce"}  # Megatron's f and g, the vocabulary-parallel embedding/loss
        if sequence_parallel:
            ops["tp"] |= {"all_gather", "reduce_scatter"}  # g and g-bar of sequence parallelism
        if pp > 1:
            ops["tp"] |= {"all_gather"}  # the last stage gathers whole logits for the loss
    return ops


def draw_plan(rng):
    """(dp, tp, pp, zero_stage, sequence_parallel) that lesson 07's GridPlan accepts."""
    sizes, _ = draw_grid(rng)
    dp, tp, pp = sizes["dp"], sizes["tp"], sizes["pp"]
    zero = rng.choice((0, 1, 2, 3)) if pp == 1 else 0  # ZeRO with pp > 1 is not built
    sp = rng.random() < 0.5 if pp == 1 and tp > 1 else False
    return dp, tp, pp, zero, sp


@fresh_cases
def check_step_collectives(step_collectives, *, rng):
    """step_collectives(dp, tp, pp, zero_stage, sequence_parallel) must return {"pp", "dp",
    "tp"}: the set of collective names each axis's group runs in one training step."""
    __tracebackhide__ = True
    expect_callable(step_collectives, "step_collectives")
    fixed = [(2, 2, 1, 1, False), (2, 1, 2, 0, False), (1, 2, 2, 0, False)]  # ZeRO, PP, TP x PP
    drawn = [draw_plan(rng) for _ in range(3 * CASES)]
    for args in fixed + drawn:
        where = ("step_collectives(dp={}, tp={}, pp={}, zero_stage={}, sequence_parallel={})"
                 .format(*args))
        got = call_in_process(step_collectives, args, exercise="step_collectives", where=where,
                              guard=ANSWERS.in_process, hint=COLLECTIVES_HINT)
        got = _as_op_sets(got, where)
        want = reference_collectives(*args)
        for axis in AXES:
            if got[axis] != want[axis]:
                fail(where, None, f"says the {axis} axis runs {_ops(got[axis])}, expected "
                                  f"{_ops(want[axis])}", _collectives_hint(axis, got, want, args))
    print(f"step_collectives: passed on {len(fixed) + len(drawn)} grids (ZeRO stages 0-3, "
          "sequence parallel on and off, axes of size 1)")


def _ops(ops):
    return "{" + ", ".join(sorted(ops)) + "}" if ops else "nothing"


def _as_op_sets(got, where):
    __tracebackhide__ = True
    hint = f"return {{'pp': set(...), 'dp': set(...), 'tp': set(...)}} of names from {OPS}"
    got = as_axes(got, where, "a set of collective names", hint)
    for axis, ops in got.items():
        if isinstance(ops, str) or not isinstance(ops, (set, frozenset, list, tuple)):
            fail(where, None, f"{axis} is {kind(ops)}, expected a set of names", hint)
        unknown = sorted(set(map(str, ops)) - set(OPS))
        if unknown:
            fail(where, None, f"{axis} names {unknown}, which are not among {OPS}", hint)
    return {axis: set(ops) for axis, ops in got.items()}


def _collectives_hint(axis, got, want, args):
    dp, tp, pp, zero, sp = args
    size = {"dp": dp, "tp": tp, "pp": pp}[axis]
    zero_ops = {"reduce_scatter", "all_gather"}
    if zero and not sp and zero_ops <= got["tp"] and not zero_ops <= got["dp"]:
        return ("ZeRO shards the model state over the data-parallel replicas (dp); the tp ranks "
                "hold different slices of the weights, not copies to shard")
    if size == 1:
        return f"{axis} has size 1 here: its group is one rank, which exchanges nothing"
    if axis == "dp" and zero and "all_reduce" in got["dp"]:
        return ("ZeRO replaces data parallelism's all-reduce by what it is made of: a "
                "reduce-scatter of the gradients, then an all-gather of the updated parameters")
    return COLLECTIVES_HINT
