"""The rank side of lesson 03's checks: what runs in each rank while a student's function runs
there. It imports none of the lesson's code (`dlcourse.parallel.data`) and holds no reference:
under `dlcourse grade` this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`,
`grading/absent.py`). The models the students never see are built here from a seed, the same in
any process; the references (one process on the whole batch, the lesson's bucket plan) are
computed in the checking process (`replicas.py`, `all_reduce_buckets.py`), a plan handed to the
ranks as parameter names. The accumulation check alone wraps the model in the lesson's
`DataParallel` (the machinery the student's loop runs in): its rank loads
`dlcourse.parallel.data` but `train_step`, the exercise's answer, refused there
(`accumulate.TRAIN_STEP`).
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dlcourse.checks.core import kind
from dlcourse.collectives.counter import CommCounter, record_of
from dlcourse.models import (GPT, MLP, GPTConfig, MLPConfig, init_weights, lm_loss,
                             synthetic_regression, synthetic_tokens)

# ---------------------------------------------------------------- models and data

MLP_CONFIG = MLPConfig(d_in=5, hidden=7, n_layers=2, d_out=3)
GPT_CONFIG = GPTConfig(vocab_size=19, seq_len=6, n_layers=1, n_heads=2, hidden=8)  # tied
SEED = 7


class WithIdleParameters(nn.Module):
    """The MLP and two parameters that get no gradient: `unused`, a layer forward never calls
    (as a model skips a layer in some steps), and `frozen`, a scale with requires_grad=False."""

    def __init__(self, config, seed=0):
        super().__init__()
        self.mlp = MLP(config, seed)
        self.unused = nn.Linear(config.d_out, 2)
        init_weights(self.unused, seed + 1, residual_layers=0)  # same seed, same weights
        scale = 1 + 0.1 * torch.randn(config.d_out, generator=torch.Generator().manual_seed(seed))
        self.frozen = nn.Parameter(scale, requires_grad=False)

    def forward(self, x):
        return self.mlp(x) * self.frozen


def _regression(n, seed, dtype):
    x, y = synthetic_regression(n, MLP_CONFIG, seed)
    return x.to(dtype), y.to(dtype)


def _tokens(n, seed, dtype):
    return synthetic_tokens(n, GPT_CONFIG, seed)


# name -> (build(seed), data(n, seed, dtype), loss_fn); every loss is a mean over the samples
MODELS = {
    "MLP": (lambda seed: MLP(MLP_CONFIG, seed), _regression, F.mse_loss),
    "tied GPT": (lambda seed: GPT(GPT_CONFIG, seed), _tokens, lm_loss),
    "MLP with idle parameters": (lambda seed: WithIdleParameters(MLP_CONFIG, seed), _regression,
                                 F.mse_loss),
}
OPTIMIZERS = {"SGD": (torch.optim.SGD, 0.1), "AdamW": (torch.optim.AdamW, 1e-3)}


def build(name, dtype=torch.float32, seed=SEED):
    return MODELS[name][0](seed).to(dtype)


def loss_of(name):
    return MODELS[name][2]


def optimizer(name, params):
    make, lr = OPTIMIZERS[name]
    return make(params, lr=lr)


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def gradients(model):
    return {name: None if p.grad is None else p.grad.detach().clone()
            for name, p in model.named_parameters()}


# ---------------------------------------------------------------- watching the student's code

class Watch(CommCounter):
    """Lesson 02's CommCounter, noting for every collective which parameter's values it carried
    (by the tensor's memory, which `p`, `p.data` and `p.detach()` share and `p.grad` does not),
    and the calls of `loss_fn` in between: `events` is [(op, nbytes, parameter name or None)]."""

    def __init__(self, model):
        super().__init__()
        self.params = {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}
        self.events = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        record = record_of(func, args, kwargs or {})
        if record is not None:
            self.events.append((record.op, record.nbytes, self._parameter_in(args)))
        return func(*args, **(kwargs or {}))

    def _parameter_in(self, args):
        for a in args:
            for t in a if isinstance(a, (list, tuple)) else [a]:
                if isinstance(t, torch.Tensor) and t.numel():
                    name = self.params.get(t.untyped_storage().data_ptr())
                    if name is not None:
                        return name
        return None

    def marked(self, loss_fn):
        """loss_fn, noting each call as a ("loss", 0, None) event."""
        def loss(output, target):
            self.events.append(("loss", 0, None))
            return loss_fn(output, target)

        return loss


# ---------------------------------------------------------------- exercises 1 and 2

def broadcast_in_rank(name, first, broadcast_parameters):
    """Runs in every rank: its own random start, then the student's broadcast."""
    model = build(name, seed=first + dist.get_rank())
    broadcast_parameters(model, dist.group.WORLD)
    return snapshot(model)


def step_in_rank(name, optimizer_name, data_parallel_step, steps):
    """Runs in every rank: the same start (as after a broadcast), then the student's steps."""
    model = build(name)
    opt = optimizer(optimizer_name, model.parameters())
    weights = [snapshot(model)]
    with Watch(model) as watch:
        for x, y in steps:
            data_parallel_step(model, opt, x, y, loss_of(name), dist.group.WORLD)
            weights.append(snapshot(model))
    return weights, watch.events


# ---------------------------------------------------------------- exercises 3 and 4: buckets

def plan_by_name(plan, model, bucket_cap_mb):
    """The student's plan as data, made where it was computed: each Parameter of `model` by its
    name, anything else as {"not": what it is}; {"not": ...} for a plan that is not a list of
    lists. (Parameters are told apart by identity, which does not survive leaving the process.)"""
    names = {id(p): n for n, p in model.named_parameters()}
    if not isinstance(plan, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in plan):
        return {"not": kind(plan)}
    return [[names.get(id(p), {"not": kind(p)}) for p in bucket] for bucket in plan]


def reduce_in_rank(name, dtype, plan, all_reduce_buckets, shard):
    """Runs in every rank: backward on its shard, then the student's all_reduce_buckets on the
    lesson's plan (`plan`: each bucket's parameter names, made in the checking process)."""
    model = build(name, dtype)
    x, y = shard
    loss_of(name)(model(x), y).backward()
    params = dict(model.named_parameters())
    with Watch(model) as watch:
        all_reduce_buckets([[params[n] for n in bucket] for bucket in plan], dist.group.WORLD)
    return gradients(model), snapshot(model), watch.events


# ---------------------------------------------------------------- exercise 5: accumulation

def accumulate_in_rank(name, wrapper, bucket_cap_mb, accumulate_step, steps):
    """Runs in every rank: the model wrapped (`wrapper`: "DataParallel", the lesson's, or "torch
    DDP"), then the student's step on each step's micro-batches, watched (all-reduces, and each
    call of loss_fn)."""
    # the lesson's wrapper (or torch's DDP), imported here only: the other checks' ranks have
    # none of the lesson's code
    from dlcourse.parallel.data import compare
    lesson_s = wrapper == "DataParallel"
    model = compare.wrap("overlapped" if lesson_s else compare.DDP, build(name), dist.group.WORLD,
                         bucket_cap_mb=bucket_cap_mb)
    n_buckets = len(model.buckets) if lesson_s else None
    opt = optimizer("SGD", model.parameters())
    weights, events = [snapshot(model.module)], []
    for micro_batches in steps:
        with Watch(model.module) as watch:
            accumulate_step(model, opt, micro_batches, watch.marked(loss_of(name)))
        weights.append(snapshot(model.module))
        events.append(watch.events)
    return weights, events, n_buckets
