"""What every tour row shares: the configuration, the result a row returns, the reference run and
the small measurements every row makes (`dlcourse tour`, see `dlcourse/tour/__init__.py`).

A row is a function `train(cfg: TourConfig) -> RowResult` that runs on every rank; each strategy's
rows live in their own module here (`data.py` for lesson 03) and compose that strategy's own
wrap / train / count functions, so a new lesson adds a module and a line in `ROWS`.
"""

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dlcourse.memory import measure_model_state
from dlcourse.models import GPT, GPTConfig, lm_loss, synthetic_tokens
from dlcourse.parallel.tensor.activations import measure_activations

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
    # the most activation bytes autograd held at once in one step (lesson 01's SavedTensorLog),
    # the batch not counted; None where the row does not measure it
    activation_bytes: int | None = None
    # one process's parameters for a row that trains another model than the tour's (interleaved
    # 1F1B needs more blocks): compared with this instead of the reference row's
    reference: dict | None = None


@dataclass
class Row:
    name: str
    train: object  # fn(TourConfig) -> RowResult, run on every rank (or in-process if ranks == 1)
    distributed: bool = True  # False: runs once, in this process
    check: object = None  # fn(TourConfig, world_size): raises ValueError before any rank starts
    tolerance: float = MATCH_TOLERANCE  # the largest |Δ| vs the reference that still matches


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


def mean_loss(loss, cfg):
    """The loss averaged over the ranks that computed one: `loss` is None on a pipeline rank
    without the last stage."""
    has = loss is not None
    return mean_over_ranks(loss if has else 0.0, cfg) / mean_over_ranks(float(has), cfg)


def train_reference(cfg):
    model = cfg.new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    x, y = cfg.data()
    # lesson 04's count of what one forward saves, on a copy: the timed steps run unwatched
    activations, _ = measure_activations(cfg.new_model(), x, y, lm_loss)
    loss, step_time = timed_steps(cfg, model, optimizer, x, y)
    return RowResult(loss, cpu_params(model), held_bytes(model, optimizer), 0, step_time,
                     activations)
