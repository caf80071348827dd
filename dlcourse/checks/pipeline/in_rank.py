"""The rank side of lesson 06's checks: what runs in each rank while a student's function runs
there. It imports none of the lesson's code and holds no reference order (`one_f_one_b` and
the whole-batch gradients run in the checking process; a rank is handed its own action list):
under `dlcourse grade` this is the one module of the set a rank loads (`answers.ANSWERS.rank_side`,
`grading/absent.py`). What it holds: the check's pipeline (`Chain`), its executor
(`run_actions`), the harnesses, and the player that finds a deadlock before a schedule runs
(`schedule_problem`: a list that cannot run must not start).
"""

import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dlcourse.checks.core import describe, kind
from dlcourse.collectives.counter import CommCounter


# ---------------------------------------------------------------- the pipeline and its executor


@dataclass
class Chain:
    """bounds[-1] float64 layers `tanh(x W^T + b)` of width d, cut at `bounds` (stage s holds
    layers bounds[s]:bounds[s+1]); every process builds the same weights from `seed`."""

    d: int
    bounds: list
    seed: int

    @property
    def n_stages(self):
        return len(self.bounds) - 1

    def layers(self, start, stop):
        out = []
        for i in range(start, stop):
            layer = torch.nn.Linear(self.d, self.d, dtype=torch.float64)
            generator = torch.Generator().manual_seed(self.seed + i)
            with torch.no_grad():  # weights ~ 1/sqrt(d): tanh stays away from saturation
                layer.weight.copy_(torch.randn(self.d, self.d, generator=generator,
                                               dtype=torch.float64) / self.d ** 0.5)
                layer.bias.copy_(0.1 * torch.randn(self.d, generator=generator,
                                                   dtype=torch.float64))
            out += [layer, torch.nn.Tanh()]
        return torch.nn.Sequential(*out)

    def stage(self, s):
        return self.layers(self.bounds[s], self.bounds[s + 1])

    def batch(self, n_micro, micro_size):
        """[(x, y)] of n_micro micro-batches, each (micro_size, d)."""
        generator = torch.Generator().manual_seed(self.seed + 1000)
        x = torch.randn(n_micro * micro_size, self.d, generator=generator, dtype=torch.float64)
        y = torch.randn(n_micro * micro_size, self.d, generator=generator, dtype=torch.float64)
        return list(zip(x.split(micro_size), y.split(micro_size)))


def stage_grads(stage):
    return [None if p.grad is None else p.grad.detach().clone() for p in stage.parameters()]


def run_actions(actions, stage, micro_batches, n_micro, last_stage=None):
    """Run this rank's actions on real ranks (the default group, stage r on rank r) and return
    the stage's gradients. The last rank's loss is F.mse_loss / n_micro, or, in the loss-scaling
    exercise, `last_stage(stage, x, y)` runs forward and backward and returns x's gradient."""
    run = _StageRun(stage, micro_batches, n_micro, last_stage)
    for what, i in actions:
        (run.forward if what == "F" else run.backward)(i)
    for work in run.sent:  # every isend has a matching recv: the schedule was played first
        work.wait()
    return stage_grads(stage)


class _StageRun:
    """One rank's stage while it runs a schedule, and what it holds for each micro-batch in
    flight. Messages are tagged: forward of i with i, backward of i with n_micro + i."""

    def __init__(self, stage, micro_batches, n_micro, last_stage):
        self.stage, self.micro_batches, self.m = stage, micro_batches, n_micro
        self.rank, p = dist.get_rank(), dist.get_world_size()
        self.first, self.last = self.rank == 0, self.rank == p - 1
        self.student = last_stage if self.last else None
        self.inputs, self.outputs, self.sent = {}, {}, []

    def forward(self, i):
        x, y = self.micro_batches[i]  # (micro_size, d) each: x is stage 0's, y the last's
        if not self.first:  # a leaf; the student's last stage must ask for its gradient
            x = self._recv(x, self.rank - 1, tag=i).requires_grad_(self.student is None)
        self.inputs[i] = x
        if self.student:
            self.outputs[i] = self.student(self.stage, x, y)  # x's gradient, to send back
        elif self.last:
            self.outputs[i] = F.mse_loss(self.stage(x), y) / self.m  # its share of the mean
        else:
            self.outputs[i] = self.stage(x)  # (micro_size, d)
            self.sent.append(dist.isend(self.outputs[i].detach(), self.rank + 1, tag=i))

    def backward(self, i):
        out, x = self.outputs.pop(i), self.inputs.pop(i)
        if self.student:
            grad_x = out
        else:  # the loss starts its own backward; a middle stage's output gets the next's
            out.backward(None if self.last else self._recv(out, self.rank + 1, self.m + i))
            grad_x = x.grad
        if not self.first:
            self.sent.append(dist.isend(_sendable(grad_x, x), self.rank - 1, tag=self.m + i))

    @staticmethod
    def _recv(like, src, tag):
        """A blocking receive of a float64 tensor shaped like `like` from src, with this tag."""
        buffer = torch.empty(like.shape, dtype=torch.float64)
        dist.recv(buffer, src, tag=tag)
        return buffer


def _sendable(grad, like):
    """What the previous stage receives: a (micro_size, d) float64 tensor; NaN where the
    student's answer was not one, so the earlier ranks' gradients show it."""
    if isinstance(grad, torch.Tensor) and grad.shape == like.shape:
        return grad.detach().to(torch.float64).contiguous()
    return torch.full(like.shape, float("nan"), dtype=torch.float64)


# ---------------------------------------------------------------- the harnesses


def exchange_in_rank(student, calls):
    """Runs in every rank: one exchange with each neighbour, in the order the calls pair up,
    and the bytes each one sent and received (send/recv, by `CommCounter`)."""
    results = []
    for peer, tensor in calls:
        mine = tensor.clone()
        with CommCounter() as comm:
            got = student(mine, peer, dist.group.WORLD)
        moved = {op: sum(r.nbytes for r in comm.records if r.op == op) for op in ("send", "recv")}
        results.append((got, mine, moved))
    return results


def interleaved_in_rank(student, n_micro, v):
    """Runs in every rank: the student's list for this rank, as data."""
    rank, p = dist.get_rank(), dist.get_world_size()
    return plain_triples(student(rank, p, n_micro, v))


def plain_triples(actions):
    """[(kind, chunk, i)] with plain str and ints, an item that is not one as None; or what the
    whole is, in words."""
    if isinstance(actions, (str, bytes)) or not hasattr(actions, "__iter__"):
        return kind(actions)
    out = []
    for item in actions:
        try:
            k, c, i = item
        except (TypeError, ValueError):
            out.append(None)
            continue
        ok = isinstance(k, str) and all(isinstance(n, numbers.Integral) and not isinstance(n, bool)
                                        for n in (c, i))
        out.append((str(k), int(c), int(i)) if ok else None)
    return out


def loss_in_rank(student, chain, n_micro, micro_size, actions):
    """Runs in every rank: 1F1B through the check's executor; the last rank calls the student's
    function for each micro-batch and notes what came back."""
    rank, p = dist.get_rank(), dist.get_world_size()
    returned = []

    def last_stage(stage, x, y):
        got = student(stage, x, y, F.mse_loss, n_micro)
        returned.append(None if isinstance(got, torch.Tensor) and got.shape == x.shape
                        else f"returned {kind(got)}, expected the gradient of x, {describe(x)}")
        return got

    grads = run_actions(actions, chain.stage(rank),
                        chain.batch(n_micro, micro_size), n_micro,
                        last_stage=last_stage if rank == p - 1 else None)
    return grads, returned


def schedule_in_rank(student, chain, n_micro, micro_size):
    """Runs in every rank: the student's list for this rank, every rank's list played against
    the others' (the same verdict on every rank, so all run it or none), then run for real."""
    rank, p = dist.get_rank(), dist.get_world_size()
    actions = student(rank, p, n_micro)
    everyone = [None] * p
    dist.all_gather_object(everyone, plain_pairs(actions))
    problem = schedule_problem(everyone, n_micro)
    if problem:
        return {"problem": problem, "actions": everyone[rank]}
    grads = run_actions(everyone[rank], chain.stage(rank), chain.batch(n_micro, micro_size),
                        n_micro)
    return {"problem": None, "actions": everyone[rank], "grads": grads}


def plain_pairs(actions):
    """The student's list as [(kind, i)] if it has that form, else what it is, in words."""
    try:
        return [(str(k), int(i)) if isinstance(k, str) and isinstance(i, numbers.Integral)
                else None for k, i in actions]
    except (TypeError, ValueError):  # not iterable, or items that are not pairs
        items = list(actions) if isinstance(actions, (list, tuple)) else []
        return kind(actions) + (f" of items like {items[0]!r}" if items else "")



# ---------------------------------------------------------------- a schedule played first


def deadlock(schedules):
    """Play every rank's actions: a forward of i on rank r needs rank r - 1's forward of i, a
    backward of i needs rank r + 1's backward of i (sends never wait, receives do). None if all
    finish, else [(rank, step, action, what it waits for)] of every rank that is stuck."""
    p = len(schedules)
    done = [set() for _ in range(p)]
    position = [0] * p
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while position[r] < len(schedules[r]):
                kind, i = schedules[r][position[r]]
                needs = (r - 1, "F") if kind == "F" else (r + 1, "B")
                if 0 <= needs[0] < p and (needs[1], i) not in done[needs[0]]:
                    break
                done[r].add((kind, i))
                position[r] += 1
                progress = True
    stuck = [(r, position[r], schedules[r][position[r]]) for r in range(p)
             if position[r] < len(schedules[r])]
    return [(r, step, action, _waits_for(r, action)) for r, step, action in stuck] or None


def _waits_for(rank, action):
    kind, i = action
    if kind == "F":
        return f"waits for rank {rank - 1}'s activation of micro-batch {i}"
    return f"waits for rank {rank + 1}'s gradient of micro-batch {i}"


def schedule_problem(schedules, n_micro):
    """(rank, problem, hint) of the first thing that stops these lists from running as a
    pipeline, or None: not a list of actions, a micro-batch missing or twice, a backward before
    its forward, a wait that never ends."""
    for rank, actions in enumerate(schedules):
        problem = _rank_problem(actions, n_micro)
        if problem:
            return (rank, *problem)
    stuck = deadlock(schedules)
    if stuck:
        waits = "; ".join(f"rank {r} at actions[{step}] = {action} {what}"
                          for r, step, action, what in stuck)
        return (stuck[0][0], f"waits forever (deadlock): {waits}",
                "a stage can only run the forward of i after the previous stage did, and the "
                "backward of i after the next stage did: follow 1F1B's order on every rank")
    return None


WARM_UP_CAP = ("with fewer micro-batches than stages ahead, the warm-up runs out of them: it "
               "is min(p - rank - 1, n_micro) forwards, then the remaining backwards")


def _rank_problem(actions, n_micro):
    """(problem, hint) if one rank's list is not m forwards and m backwards, each forward before
    its backward."""
    form = 'a list of ("F", i) and ("B", i) pairs, i from 0 to n_micro - 1'
    if isinstance(actions, str) or any(a is None or a[0] not in ("F", "B") for a in actions):
        what = actions if isinstance(actions, str) else "an item that is not one"
        return f"returned {what}, expected {form}", "e.g. [('F', 0), ('F', 1), ('B', 0), ...]"
    seen = {}
    for step, action in enumerate(actions):
        what, i = action
        if not 0 <= i < n_micro:
            return (f"runs actions[{step}] = {action}, but micro-batches are 0 to {n_micro - 1}",
                    WARM_UP_CAP if what == "F" and i >= n_micro else form)
        if action in seen:
            return (f"runs {action} twice: actions[{seen[action]}] and actions[{step}]",
                    "each micro-batch's forward and backward run once per step")
        if what == "B" and ("F", i) not in seen:
            return (f"runs actions[{step}] = {action}, the backward of micro-batch {i}, before "
                    "its forward", "a backward needs the activations its forward saved: in the "
                    "steady state each step runs a forward (the newest), then a backward (the "
                    "oldest)")
        seen[action] = step
    missing = [(k, i) for k in "FB" for i in range(n_micro) if (k, i) not in seen]
    if missing:
        return (f"never runs {missing[0]} ({len(missing)} actions missing)",
                "every micro-batch needs its forward and its backward on every stage")
    return None
