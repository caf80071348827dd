"""The tour's one row runner (`dlcourse tour`, see `dlcourse/tour/__init__.py`): any entry of the
catalogue (`dlcourse.strategies`) trained, timed and measured the same way, on every rank of a
job that runs every row of one world size. An entry with `own_job` (one that kills a rank) is not
run here: the tour calls its `own_job` after that job, in launches of its own."""

import statistics
import time
import torch
import torch.distributed as dist

from dlcourse.models import lm_loss
from dlcourse.parallel.tensor.activations import measure_activations
from dlcourse.strategies.trainer import RowResult, cpu_params, held_bytes, mean_loss


def run_rows(strategies, cfg):
    """On every rank: each strategy's row in turn (the groups of one grid made once, shared)."""
    made = {}
    results = []
    for strategy in strategies:
        grid = strategy.grid(cfg, dist.get_world_size())
        if grid not in made:
            made[grid] = grid.new_groups()
        results.append(run_row(strategy, cfg, made[grid]))
    return results


def run_row(strategy, cfg, groups):
    """cfg.steps AdamW steps of `strategy`'s trainer on the global batch, timed; its state bytes
    and full parameters; one step on a fresh trainer counted apart (bytes moved, activations
    held), so that counting does not slow the timed steps. Rank 0 also brings the one-process
    run of a strategy that names its own reference."""
    x, y = cfg.data()
    trainer = strategy.build(cfg, groups)
    loss, step_time = timed_steps(cfg, trainer.train_step, x, y)
    state = round(trainer.held_bytes())
    params = {k: v.detach().to("cpu", copy=True) for k, v in trainer.full_parameters().items()}
    comm, activations = strategy.build(cfg, groups).counted(x, y)
    result = RowResult(mean_loss(loss, cfg), params, state, comm, step_time, activations)
    if strategy.reference and dist.get_rank() == 0:  # the row's result is rank 0's
        result.reference = cpu_params(train_one_process(cfg, strategy.reference(cfg),
                                                        strategy.loss))
    return result


def timed_steps(cfg, train_step, x, y):
    """cfg.steps calls of train_step(x, y); (the last loss, median seconds per step)."""
    times, loss = [], None
    for _ in range(cfg.steps):
        start = time.perf_counter()
        loss = train_step(x, y)
        if cfg.cuda:
            torch.cuda.synchronize()  # GPU work is asynchronous: wait for it before the clock
        times.append(time.perf_counter() - start)
    return (None if loss is None else float(loss)), statistics.median(times)


def train_one_process(cfg, model, loss=None):
    """`model` trained cfg.steps AdamW steps on the whole global batch in this process."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss_fn = loss or (lambda model, logits, y: lm_loss(logits, y))
    x, y = cfg.data()
    for _ in range(cfg.steps):
        value = loss_fn(model, model(x), y)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
    return model


def train_reference(cfg):
    """The single-process row: the plain GPT, timed; what one forward saves counted on a copy."""
    model = cfg.new_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    x, y = cfg.data()
    activations, _ = measure_activations(cfg.new_model(), x, y, lm_loss)

    def train_step(x, y):
        value = lm_loss(model(x), y)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        return value.item()
    loss, step_time = timed_steps(cfg, train_step, x, y)
    return RowResult(loss, cpu_params(model), held_bytes(model, optimizer), 0, step_time,
                     activations)
