"""Run a function on N real ranks from a notebook cell, a script, or inside torchrun (lesson 00).

    results = dlcourse.launch(fn, x, world_size=4)   # fn(x) on 4 processes, results in rank order

Each rank is a fresh process with the default process group already initialised, so `fn` uses
torch's own API: `dist.get_rank()`, `dist.all_reduce(t)`, ... Ranks are forked from a
multiprocessing forkserver that has imported torch once, so a warm launch costs a fraction of a
second instead of one torch import per rank.
"""

import atexit
import linecache
import multiprocessing as mp
import numbers
import os

import torch
import torch.distributed as dist

from dlcourse import backends, pickling, supervise, tracebacks, worker
from dlcourse.backends import cpu_cores
from dlcourse.errors import RankError, RankTimeout
from dlcourse.scripts import check_main_guard

DEFAULT_TIMEOUT_S = 60.0  # a lesson cell's job runs in seconds; a deadlock shows up in one minute
# The parent waits with `selectors`, whose epoll counts milliseconds in a C int: 2**31 ms is
# 24.8 days. 24 days, less the process group's margin, stays below it.
MAX_TIMEOUT_S = 24 * 24 * 3600.0 - worker.PROCESS_GROUP_MARGIN_S

__all__ = ["launch", "launch_as_data", "launch_watched", "PerRank", "RankError", "RankTimeout",
           "DEFAULT_TIMEOUT_S",
           "MAX_TIMEOUT_S"]


class PerRank:
    """An argument of `launch` that differs by rank: rank r is called with `values[r]`, and its
    job carries that value only, not the other ranks'. A check gives each rank its shard this
    way, so a rank's code cannot read the whole (lesson 04: `dlcourse.checks.core.run_on_ranks`).
    """

    def __init__(self, values):
        self.values = list(values)


def launch(fn, *args, world_size=4, backend="auto", timeout=DEFAULT_TIMEOUT_S, **kwargs):
    """Run `fn(*args, **kwargs)` on `world_size` ranks and return their results in rank order.

    backend: "gloo" (CPU), "nccl" (one GPU per rank) or "auto" (nccl when there is a GPU for
    every rank, else gloo; one line says which and why).
    timeout: seconds the job may run once every rank has joined the process group (not counting
    the forkserver that the first launch in a process starts, which imports torch, nor a loaded
    machine's slow process start). A rank that raises or
    crashes stops every rank and raises `RankError` (its `outcomes`: what each rank did, as
    `errors.RankOutcome` data); a job still running at the deadline raises `RankTimeout`. At
    most `MAX_TIMEOUT_S` (24 days): the longest wait the operating system's select takes.

    An argument wrapped in `PerRank([v0, v1, ...])` is `v_r` on rank r (and only there).

    Inside a rank that is already launched (torchrun, or a rank of this launcher) `fn` runs in the
    current process under the existing process group and `[result]` is returned.
    """
    return _launch(fn, args, kwargs, world_size, backend, timeout, as_data=False)


def launch_as_data(fn, *args, world_size=4, backend="auto", timeout=DEFAULT_TIMEOUT_S, hide=(),
                   absence=None, wire=None, **kwargs):
    """`launch` for ranks that run code you do not trust (`dlcourse grade`'s checks run a
    submission's functions this way): what each rank returns is turned into data in the rank
    (numpy numbers and arrays, Fractions as Python's: `returned.as_data`), saved with torch.save
    and read back with torch.load(weights_only=True), which builds tensors, numbers, strings and
    lists, tuples, dicts and sets of them and nothing else; a rank's report of how it ended is
    read by an unpickler that builds only a `RankOutcome`. No object a rank chose is ever
    unpickled here. Where Linux allows, each rank runs in a sandbox of its own: no file one rank
    writes is seen by another, and the files in `hide` cannot be read, once the modules the
    job's own objects need are imported (`dlcourse/grading/rank_sandbox.py`). `absence`
    (`grading.absent.Absence`), if given, is made true in each rank before it unpickles its
    job: the modules it names are not there."""
    return _launch(fn, args, kwargs, world_size, backend, timeout, as_data=True,
                   hide=hide, wire=wire, absence=absence)


def launch_watched(fn, *args, world_size=4, backend="auto", timeout=DEFAULT_TIMEOUT_S, wire=None,
                   **kwargs):
    """`launch`, calling `wire({rank: bytes received from the other ranks})` once every rank
    has returned: counted by the kernel, outside the ranks (`supervise.run_ranks`). A check's
    self-check measures what a student's ranks moved this way."""
    return _launch(fn, args, kwargs, world_size, backend, timeout, as_data=False, wire=wire)


def _rank_sandbox(hide):
    """What each rank of `launch_as_data` needs for a sandbox of its own (a private /tmp and
    /dev/shm, its own /proc, `hide` unreadable: `dlcourse/grading/rank_sandbox.py`), or None
    where this machine cannot make one."""
    from dlcourse.grading import rank_sandbox
    if not rank_sandbox.works():
        return None
    return tuple(rank_sandbox.needed_paths()), tuple(hide)


def _launch(fn, args, kwargs, world_size, backend, timeout, as_data, hide=(), wire=None,
            absence=None):
    _check_arguments(fn, world_size, backend, timeout, args, kwargs)
    if backends.in_launched_rank():
        return [_run_in_this_rank(fn, args, kwargs, world_size, backend, timeout)]
    check_main_guard()
    backend, why = backends.choose(backend, world_size)
    if any(isinstance(v, PerRank) for v in [*args, *kwargs.values()]):
        payloads = [_pickle_job(fn, *_for_rank(r, args, kwargs)) for r in range(world_size)]
    else:  # the same job for every rank: pickled once
        payloads = [_pickle_job(fn, args, kwargs)] * world_size
    if why:
        print(f"dlcourse.launch: {world_size} ranks on {backend} ({why})")
    threads = max(1, cpu_cores() // world_size)
    sources = _cell_sources()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    sandbox = _rank_sandbox(hide) if as_data else None
    jobs = [
        worker.RankJob(rank, world_size, backend, threads, store.port, timeout, payload, sources,
                       as_data, sandbox, absence)
        for rank, payload in enumerate(payloads)
    ]
    try:
        return supervise.run_ranks(_forkserver(), jobs, timeout, wire)
    except KeyboardInterrupt:  # run_ranks has stopped every rank; the student needs no frames
        raise tracebacks.interrupted("launch interrupted; every rank was stopped") from None
    finally:
        del store  # closes the rendezvous port


def _for_rank(rank, args, kwargs):
    """(args, kwargs) of `rank`'s call: each `PerRank` argument replaced by its value."""
    def pick(value):
        return value.values[rank] if isinstance(value, PerRank) else value
    return tuple(map(pick, args)), {k: pick(v) for k, v in kwargs.items()}


def _check_arguments(fn, world_size, backend, timeout, args=(), kwargs=None):
    if not callable(fn):
        raise TypeError(f"launch needs a function to run on every rank, got {type(fn).__name__}")
    for value in [*args, *(kwargs or {}).values()]:
        if isinstance(value, PerRank) and len(value.values) != world_size:
            raise ValueError(f"a PerRank argument holds {len(value.values)} values, one a rank: "
                             f"world_size is {world_size}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of ranks >= 1, got {world_size!r}")
    if backend not in backends.NAMES:
        raise ValueError(f"backend must be one of {backends.NAMES}, got {backend!r}")
    if (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)
            or not 0 < timeout <= MAX_TIMEOUT_S):
        raise ValueError(f"timeout is in seconds and must be > 0 and at most {MAX_TIMEOUT_S:.0f} "
                         f"(24 days), got {timeout!r}")


def _pickle_job(fn, args, kwargs):
    """Pickle by value, so functions and lambdas defined in a notebook cell reach the ranks."""
    try:
        return pickling.dumps((fn, args, kwargs))
    except Exception as error:
        named = [("the function", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)]
        named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        culprit = next((name for name, v in named if not _picklable(v)), "the job")
        raise TypeError(
            f"{culprit} cannot be pickled, so it cannot be sent to the ranks ({error}). "
            "Create that object inside the function instead of passing it in."
        ) from None


def _picklable(value):
    try:
        pickling.dumps(value)
        return True
    except Exception:
        return False


def _cell_sources():
    """Source lines of notebook cells, so a rank's traceback can show the failing line.

    IPython keeps each executed cell in `linecache` with no file on disk (mtime None); a rank
    process has no such cache of its own.
    """
    return {name: entry for name, entry in linecache.cache.items()
            if len(entry) == 4 and entry[1] is None}


def _forkserver():
    ctx = mp.get_context("forkserver")
    # Imported once by the forkserver (started at the first launch); every rank is a fork of it,
    # so it starts with these already imported. torch._dynamo is imported by the first optimizer
    # or DDP a process builds: 1.2 s per rank, paid on every launch if not here.
    # torch.distributed.optim and .fsdp (ZeRO and FSDP, lesson 05): 0.7 s per rank otherwise.
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "torch.optim",
                                "torch.nn.parallel", "torch.distributed.optim",
                                "torch.distributed.fsdp", "dlcourse.worker",
                                "dlcourse.launcher"])  # `import dlcourse` no longer brings it
    return ctx


def _run_in_this_rank(fn, args, kwargs, world_size, backend, timeout):
    launched = int(os.environ["WORLD_SIZE"])
    if world_size != launched:
        raise ValueError(
            f"launch(world_size={world_size}) runs inside a job of {launched} ranks (WORLD_SIZE "
            f"is set, e.g. by torchrun). Pass world_size={launched}, or start torchrun so that "
            f"nodes x --nproc-per-node = {world_size}."
        )
    if not dist.is_initialized():
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend, _ = backends.choose(backend, local_size)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(
            backend, timeout=backends.timedelta_s(timeout + worker.PROCESS_GROUP_MARGIN_S))
        # Left to interpreter exit, gloo's threads can abort the process ("terminate called").
        atexit.register(_destroy_process_group)
    args, kwargs = _for_rank(dist.get_rank(), args, kwargs)
    return fn(*args, **kwargs)


def _destroy_process_group():
    if dist.is_initialized():
        dist.destroy_process_group()
