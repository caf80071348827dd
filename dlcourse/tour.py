"""`dlcourse tour`: the whole course in one table.

Trains the course GPT with every strategy built so far, each on real ranks, checks each against
the single-process reference, and prints: strategy, final loss, max difference from the
reference, model-state bytes per rank, communication bytes per step, step time.

A strategy is a row in `ROWS`: a name and a function that runs on every rank and returns a
`RowResult`. Each lesson that builds a strategy adds its row here.
"""

import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

import dlcourse
from dlcourse import backends
from dlcourse.memory import count_params, measure_model_state
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.data.compare import DDP, train_tour_row

# Rounding: a sum over 4 ranks adds the same fp32 numbers in another order (~1e-7 relative).
# AdamW divides each update by sqrt(v); for a gradient element near zero that turns rounding
# noise into a step of up to ~lr. Measured after 5 steps at lr 1e-3: DDP 2.5e-6, SGD 7e-9.
MATCH_TOLERANCE = 1e-5


@dataclass
class TourConfig:
    model: GPTConfig = field(default_factory=GPTConfig)
    global_batch: int = 16  # sequences per optimizer step, split evenly over the ranks
    steps: int = 5  # optimizer steps
    lr: float = 1e-3  # AdamW learning rate
    seed: int = 0  # weights; the data uses seed + 1
    cuda: bool = False  # rows on nccl: each rank (and the reference) on its own current GPU

    def device(self):
        return torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")

    def new_model(self):
        """The course GPT as every row starts it: same seed, on this process's device."""
        return GPT(self.model, seed=self.seed).to(self.device())

    def data(self):
        """The global batch (inputs, targets), each (global_batch, seq_len), on the device."""
        x, y = synthetic_tokens(self.global_batch, self.model, seed=self.seed + 1)
        return x.to(self.device()), y.to(self.device())


@dataclass
class RowResult:
    loss: float  # loss of the last step
    params: dict  # name -> full parameter tensor after training (on CPU), for the comparison
    state_bytes: int  # parameters + gradients + optimizer state held by this rank
    comm_bytes: int | None  # bytes this rank's collectives moved per step; None if not counted
    step_time: float  # median seconds per step


@dataclass
class Row:
    name: str
    train: object  # fn(TourConfig) -> RowResult, run on every rank (or in-process if ranks == 1)
    distributed: bool = True  # False: runs once, in this process


def held_bytes(model, optimizer):
    """Bytes of parameters, gradients and optimizer state this process holds (lesson 01)."""
    return measure_model_state(model, optimizer).model_state


def timed_steps(cfg, model, optimizer, x, y):
    """Run cfg.steps AdamW steps; return (last loss, median step seconds)."""
    times = []
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = lm_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if cfg.cuda:
            torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before reading the clock
        times.append(time.perf_counter() - start)
    return loss.item(), statistics.median(times)


def cpu_params(model):
    """name -> a CPU copy of each parameter, for comparing with the reference."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.named_parameters()}


def mean_over_ranks(value, cfg):
    t = torch.tensor([float(value)], device=cfg.device())
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def train_reference(cfg):
    model = cfg.new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss, step_time = timed_steps(cfg, model, optimizer, *cfg.data())
    return RowResult(loss, cpu_params(model), held_bytes(model, optimizer), 0, step_time)


ROWS = [
    Row("single process (reference)", train_reference, distributed=False),
    Row("DP naive (lesson 03)", partial(train_tour_row, "naive")),
    Row("DP bucketed (lesson 03)", partial(train_tour_row, "bucketed")),
    Row("DP overlapped (lesson 03)", partial(train_tour_row, "overlapped")),
    Row("torch DDP", partial(train_tour_row, DDP)),
]


def run(world_size=4, steps=5, backend="auto", rows=None, out=print):
    """Run every row; print the table with `out` and return it as a list of dicts."""
    backend, why = backends.choose(backend, world_size)
    cfg = TourConfig(steps=steps, cuda=backend == "nccl")
    if cfg.global_batch % world_size:
        raise ValueError(f"--world-size {world_size} does not divide the global batch of "
                         f"{cfg.global_batch} sequences; use 1, 2, 4, 8 or 16 ranks")
    out(f"dlcourse tour: GPT of {count_params(cfg.model):,} parameters, {steps} AdamW steps, global batch "
        f"{cfg.global_batch}; {world_size} ranks on {backend}" + (f" ({why})" if why else ""))
    table, reference = [], None
    with tqdm(rows or ROWS, desc="strategies", unit="row", leave=False) as progress:
        for row in progress:
            progress.set_postfix_str(row.name)
            result = _run_row(row, cfg, world_size, backend)
            reference = reference or result.params
            table.append(_summarise(row, result, reference, world_size if row.distributed else 1))
    out(format_table(table))
    return table


def _run_row(row, cfg, world_size, backend):
    if not row.distributed:
        return row.train(cfg)
    results = dlcourse.launch(row.train, cfg, world_size=world_size, backend=backend, timeout=600)
    first = results[0]
    first.state_bytes = max(r.state_bytes for r in results)
    return first


def _summarise(row, result, reference, ranks):
    diff = max((result.params[k] - reference[k]).abs().max().item() for k in reference)
    return {
        "strategy": row.name,
        "ranks": ranks,
        "final loss": result.loss,
        "max |Δ| vs reference": diff,
        "matches": diff <= MATCH_TOLERANCE,
        "model-state bytes/rank": result.state_bytes,
        "comm bytes/step/rank": result.comm_bytes,
        "step time (ms)": 1000 * result.step_time,
    }


def format_table(table):
    def cell(key, value):
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "NO"
        if key.startswith("max"):
            return f"{value:.1e}"
        if isinstance(value, float):
            return f"{value:.4f}" if key == "final loss" else f"{value:.1f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    keys = list(table[0])
    rows = [[cell(k, r[k]) for k in keys] for r in table]
    widths = [max(len(k), *(len(r[i]) for r in rows)) for i, k in enumerate(keys)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(r) for r in rows])


