"""Check for lesson 11's first exercise (`exercises/11_checkpoints.ipynb`), on 2 real gloo ranks:

    check_resume_state(resume_state)

`resume_state(run)` returns, on every rank, what that rank needs to go on: a dict with any of
"model", "optimizer", "scheduler", "rng", "tracker", "data", each in the form the run's part takes
back (`load_state_dict`, `torch.set_rng_state`, the tracker's states). In a first 2-rank job each
rank trains lesson 11's run (`checkpoint/run.py`: TP GPT with dropout, AdamW, warm-up, shuffled
data; its seed, dropout, warm-up and the step k drawn) for k steps, calls the student's function,
and sends the state back through torch.save / torch.load (`in_rank.saved_in_rank`). That job ends:
its processes are gone. A second job, the check's own, fresh processes, records on each rank the
trace of the same run never stopped, starts the run afresh, puts the rank's state back with this
check's own `_put_back`, trains 2 more steps and compares them with the trace through lesson
10's finder (`debug.forgetting.compare_runs`). Nothing but the returned state crosses from
the student's job to the check's. The first gap names what was missing: each piece shows at its
own place, and on the ranks that lack it. Under `dlcourse grade` the student's ranks have none
of the lesson's answers (`answers.ANSWERS`: `resume.py`, `files.py`, ...) and none of these
checks but `in_rank.py`.
"""

import torch

import dlcourse
from dlcourse.debug.forgetting import compare_runs, first_divergence, record_run
from dlcourse.checkpoint.run import RunConfig, TrainRun, trained
from dlcourse.checks.checkpoint.answers import ANSWERS
from dlcourse.checks.checkpoint.in_rank import saved_in_rank
from dlcourse.checks.core import CHECK_TIMEOUT_S, expect_callable, fail, fresh_cases, run_on_ranks
from dlcourse.errors import RankError
from dlcourse.launcher import PerRank
from dlcourse.models import GPTConfig

N_MORE = 2  # steps compared after the resume
HINT = ("a step reads the parameters, AdamW's state, the schedule's step, both random streams "
        "and the data position: return each, from this rank")


def _put_back(run, state):
    """The check's restore: each piece the student returned, into the fresh run's part."""
    state = state if isinstance(state, dict) else {}
    if "model" in state:
        run.model.load_state_dict(state["model"])
    if "optimizer" in state:
        run.optimizer.load_state_dict(state["optimizer"])
    if "scheduler" in state:
        run.scheduler.load_state_dict(state["scheduler"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    if "tracker" in state:
        run.tracker.states.update(state["tracker"])
    if "data" in state:
        run.data.load_state_dict(state["data"])


def _resume_in_rank(cfg, k, state):
    """Second job, fresh processes, the check's own: the trace of the run never stopped, then
    a run started afresh (`TrainRun` seeds every stream), the state put back, compared."""
    reference = record_run(trained(cfg, k), N_MORE)
    run = TrainRun(cfg, torch.distributed.group.WORLD)
    _put_back(run, state)
    return compare_runs(reference, run, N_MORE)


def config(rng):
    model = GPTConfig(vocab_size=32, seq_len=8, n_layers=2, n_heads=2, hidden=16,
                      dropout=rng.choice([0.1, 0.2, 0.3]))
    return RunConfig(model=model, n_sequences=rng.choice([16, 20, 24]), warmup=rng.randrange(4, 8),
                     seed=rng.randrange(10_000))


@fresh_cases
def check_resume_state(resume_state, timeout=CHECK_TIMEOUT_S, *, rng):
    """resume_state(run) -> {piece: state}: a run restored from it on 2 ranks must go on exactly as
    one that never stopped."""
    __tracebackhide__ = True
    expect_callable(resume_state, "resume_state")
    cfg, k = config(rng), rng.randrange(2, 6)
    where = (f"resume_state on 2 ranks (saved after step {k}, dropout {cfg.model.dropout}, "
             f"warm-up {cfg.warmup} steps)")
    saved = run_on_ranks(resume_state, [(cfg, k)] * 2, exercise="resume_state", where=where,
                         hint=HINT, harness=saved_in_rank, guard=ANSWERS.in_rank,
                         timeout=timeout)
    states = [value for value, _ in saved]
    try:
        outcomes = dlcourse.launch(_resume_in_rank, cfg, k, PerRank(states), world_size=2,
                                   timeout=timeout)
    except RankError as error:
        fail(where, error.rank, f"the state it returned could not be put back: "
                                f"{error.failures.get(error.rank)}",
             "return each piece in the form its part takes back: a state_dict for the model, "
             "the optimizer, the scheduler and the data; torch.get_rng_state(); the tracker's "
             "states dict")
    first = first_divergence([gaps for gaps, _ in outcomes], k)
    if first is not None:
        fail(where, first.ranks[0], f"resumed, the run parts from the one that never stopped: "
                                    f"{first}", _hint(first, k))
    worst = max(final for _, final in outcomes)
    if worst != 0.0:
        fail(where, None, f"after {N_MORE} resumed steps a parameter differs by {worst:.1e}", HINT)
    print(f"resume_state: passed (resumed after step {k} on 2 ranks, {N_MORE} more steps: every "
          "activation, gradient and parameter equal to the run that never stopped, bit for bit)")


def _hint(first, k):
    """What the place of the first gap says was missing."""
    one_rank = (f" It differs on rank {first.ranks[0]} only: that rank's own copy is missing; "
                "every rank saves and restores its own.") if len(first.ranks) == 1 else ""
    if first.phase == "parameters before the step":
        return "the parameters themselves did not come back: save the model's state_dict"
    if first.phase == "activations" and first.name == "tok_emb":
        return ("the first resumed step trained on other sequences: the data stream's position "
                "(run.data.state_dict()) was not saved")
    if first.phase == "activations" and first.name.endswith("attn_dropout"):
        return ("the attention dropout drew other masks: it draws from this rank's own stream in "
                "run.tracker (lesson 04), not from torch's default generator." + one_rank)
    if first.phase == "activations" and "dropout" in first.name:
        return ("the residual dropout drew other masks: torch's default generator "
                "(torch.get_rng_state()) was not saved." + one_rank)
    if first.phase == "parameters after the step" and first.step == k + 1:
        return "the update differs from its first step: AdamW's moments and step count are missing"
    if first.phase == "parameters after the step":
        return ("the first resumed step is right and the next is not: the optimizer carried the "
                "learning rate once, then the fresh schedule set its own; save the scheduler")
    return HINT + one_rank
