"""Pipeline schedules as data (lesson 06, `lessons/06_pipeline.ipynb`).

A schedule says, for one rank, which piece of work it does in which order: a list of `Action`s,
each the forward `F`, backward `B` or (zero-bubble only) weight-gradient `W` pass of one
micro-batch on one stage. One small function per schedule builds that list; one executor
(`executor.py`) runs any of them, and `simulate` draws any of them before it runs.

    gpipe(rank=1, n_stages=4, n_micro=8)      # [1F0, 1F1, ..., 1F7, 1B0, ..., 1B7]

p = n_stages ranks, m = n_micro micro-batches. The papers: GPipe (Huang et al. 2019), 1F1B
(PipeDream-Flush, Narayanan et al. 2021), interleaved 1F1B (Narayanan et al. 2021, Megatron-LM),
ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
"""

from typing import NamedTuple


class Action(NamedTuple):
    stage: int  # the (virtual) stage it runs on; rank = stage % n_stages
    kind: str  # "F" forward, "B" backward (input gradient only if the schedule has W), "W"
    mb: int  # the micro-batch

    def __str__(self):  # torch.distributed.pipelining's notation: "0F3" = stage 0, forward, mb 3
        return f"{self.stage}{self.kind}{self.mb}"

    __repr__ = __str__


def naive(rank, n_stages, n_micro=1):
    """The whole batch as one micro-batch: forward through every stage, then backward."""
    if n_micro != 1:
        raise ValueError(f"the naive schedule runs the whole batch at once (n_micro=1), got "
                         f"n_micro={n_micro}; use gpipe to split it into micro-batches")
    return gpipe(rank, n_stages, 1)


def gpipe(rank, n_stages, n_micro):
    """GPipe: every micro-batch's forward, then every backward. Holds m micro-batches' activations.
    """
    _check(rank, n_stages, n_micro)
    return ([Action(rank, "F", i) for i in range(n_micro)]
            + [Action(rank, "B", i) for i in range(n_micro)])


def one_f_one_b(rank, n_stages, n_micro):
    """1F1B: a warm-up of forwards, a steady state alternating one forward and one backward, a
    cool-down of backwards. At most p - rank micro-batches in flight, whatever m."""
    _check(rank, n_stages, n_micro)
    n_warmup = min(n_stages - 1 - rank, n_micro)  # the last stage starts backward at once
    return (warmup(rank, n_warmup) + steady_state(rank, n_warmup, n_micro)
            + cooldown(rank, n_micro - n_warmup, n_micro))


def warmup(stage, n_warmup):
    """Forwards 0 .. n_warmup-1: filling the pipe until the first gradient can come back."""
    return [Action(stage, "F", i) for i in range(n_warmup)]


def steady_state(stage, n_warmup, n_micro):
    """One forward (of micro-batch n_warmup + i), then one backward (of micro-batch i)."""
    out = []
    for i in range(n_micro - n_warmup):
        out += [Action(stage, "F", n_warmup + i), Action(stage, "B", i)]
    return out


def cooldown(stage, first, n_micro):
    """The backwards left after the last forward: draining the pipe."""
    return [Action(stage, "B", i) for i in range(first, n_micro)]


def interleaved_1f1b(rank, n_stages, n_micro, v=2):
    """Interleaved 1F1B: each rank holds v stages (chunks) of the model, stage = chunk * p + rank.
    Micro-batches go through the chunks in groups of p; the warm-up is 2(p - rank - 1) + (v-1)p
    forwards; then 1F1B. The bubble shrinks v times, the messages grow v times."""
    _check(rank, n_stages, n_micro)
    if n_micro % n_stages:
        raise ValueError(f"interleaved 1F1B sends micro-batches through the chunks in groups of "
                         f"p = {n_stages}: n_micro {n_micro} must be a multiple of {n_stages}")
    total = n_micro * v  # forwards (and backwards) this rank runs: m on each of its v chunks
    n_warmup = min(2 * (n_stages - rank - 1) + (v - 1) * n_stages, total)
    forward = [_chunk_action(rank, n_stages, v, k, "F") for k in range(total)]
    backward = [_chunk_action(rank, n_stages, v, k, "B") for k in range(total)]
    out = forward[:n_warmup]
    for k in range(total - n_warmup):  # steady state
        out += [forward[n_warmup + k], backward[k]]
    return out + backward[total - n_warmup:]  # cool-down


def _chunk_action(rank, n_stages, v, k, kind):
    """The k-th forward (or backward) of a rank: groups of p micro-batches, chunk by chunk
    (backward walks the chunks last to first)."""
    group, within = divmod(k, n_stages * v)
    chunk = within // n_stages
    if kind == "B":
        chunk = v - 1 - chunk
    return Action(chunk * n_stages + rank, kind, group * n_stages + within % n_stages)


def zb_h1(rank, n_stages, n_micro):
    """ZB-H1: 1F1B with the backward split into B (gradient of the input, which the previous
    stage waits for) and W (gradient of the weights, which nobody waits for). Rank r keeps r W's
    pending and runs them where 1F1B would idle in the cool-down: with F = B = W the bubble is
    (p-1) units instead of 1F1B's 3(p-1), after 1F1B's warm-up (p micro-batches in flight at most).
    """
    out, pending = [], []
    for action in one_f_one_b(rank, n_stages, n_micro):
        out.append(action)
        if action.kind == "B":
            pending.append(action.mb)
            if len(pending) > rank:
                out.append(Action(rank, "W", pending.pop(0)))
    return out + [Action(rank, "W", mb) for mb in pending]


SCHEDULES = {  # name -> fn(rank, n_stages, n_micro) -> [Action]
    "naive": naive,
    "GPipe": gpipe,
    "1F1B": one_f_one_b,
    "interleaved 1F1B": interleaved_1f1b,
    "ZB-H1": zb_h1,
}


def stages_per_rank(actions):
    """The stages a rank's actions run on, in order: [rank] or, interleaved, v of them."""
    return sorted({a.stage for a in actions})


def _check(rank, n_stages, n_micro):
    for name, value in (("n_stages", n_stages), ("n_micro", n_micro)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not 0 <= rank < n_stages:
        raise ValueError(f"rank {rank} is not a pipeline rank: there are {n_stages} "
                         f"(0..{n_stages - 1})")
