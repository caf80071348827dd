"""Refusing communication that an exercise does not allow, while a student's function runs in a
rank (all undone when the check ends); the answers themselves are refused by `refuse.py`.
- `forbidden(names, why)`: torch.distributed's functions of those names raise, and so does the
  collective itself when it reaches torch's dispatcher by another road (a `ProcessGroup`
  method, the functional collectives), which lesson 02's `CommCounter` also watches.
- `no_store()`: every c10d store refuses to be read or written (the default group's, or a
  TCPStore the student makes): data between ranks goes through collectives or send/recv, which
  a check can count, not through the rendezvous's key-value store.
- `none_named()`: a collective given None where a tensor goes says so in one line.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from dlcourse.checks.core.refuse import ForbiddenCall
from dlcourse.collectives.counter import record_of

# torch.distributed's function names -> the collective the dispatcher sees (`record_of`'s ops)
_DISPATCHED_AS = {"all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
                  "all_gather_object": "all_gather", "all_gather_coalesced": "all_gather",
                  "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base":
                  "reduce_scatter", "all_to_all_single": "all_to_all", "all_reduce_coalesced":
                  "all_reduce", "gather_object": "gather", "scatter_object_list": "scatter",
                  "broadcast_object_list": "broadcast"}


@contextlib.contextmanager
def forbidden(names, why):
    """torch.distributed's `names` raise ForbiddenCall while the block runs, called by any name,
    and so do the collectives they issue when issued another way."""
    ops = {_DISPATCHED_AS.get(n, n) for n in names}
    with _dist_replaced(names, lambda name, original: _guard(name, why)), \
            (_RefuseOps(ops, why) if ops else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def _dist_replaced(names, stand_in):
    """While the block runs, each of torch.distributed's `names` is `stand_in(name, original)`;
    then it is put back. dist.all_reduce and c10d.all_reduce are one function under two names:
    both get one stand-in, as torch has one function."""
    saved = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in names if hasattr(m, n)]
    stand_ins = {}
    for module, name, original in saved:
        setattr(module, name, stand_ins.setdefault(id(original), stand_in(name, original)))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _guard(name, why):
    def forbidden_call(*args, **kwargs):
        raise ForbiddenCall(f"called dist.{name}, which this exercise does not allow: {why}")

    return forbidden_call


class _RefuseOps(TorchDispatchMode):
    """Refuses, at torch's dispatcher, the collectives in `ops` however they were issued."""

    def __init__(self, ops, why):
        super().__init__()
        self.ops, self.why = ops, why

    @classmethod
    def _should_skip_dynamo(cls):
        return False  # as CommCounter: no torch._dynamo import in a fresh rank

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        record = record_of(func, args, kwargs or {})
        if record is not None and record.op in self.ops:
            raise ForbiddenCall(f"called {record.op} (through the process group), which this "
                                f"exercise does not allow: {self.why}")
        return func(*args, **(kwargs or {}))


# torch.distributed's collectives, whose first argument a student may pass as a gradient that
# is None (a parameter no layer used, or .grad read before backward). Not send/recv/isend/irecv:
# P2POp knows dist.isend and dist.irecv by identity, so they must stay torch's own.
_TAKE_TENSORS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                 "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
                 "all_to_all_single")


def none_named():
    """While the block runs, a torch.distributed call given None where a tensor goes fails with
    one line that says so (torch's own message puts the 'got None' on its second line, which a
    gradebook does not keep)."""
    return _dist_replaced(_TAKE_TENSORS, _none_check)


def _none_check(name, original):
    def call(*args, **kwargs):
        first = args[0] if args else kwargs.get("tensor", kwargs.get("tensor_list", 0))
        lists = [a for a in (*args[:2], *kwargs.values()) if isinstance(a, (list, tuple))]
        if first is None or any(t is None for given in lists for t in given):
            raise TypeError(f"dist.{name} was given None instead of a tensor: a parameter's "
                            ".grad is None until backward computes one (and stays None for a "
                            "parameter the loss did not use); skip those, or use zeros")
        return original(*args, **kwargs)

    return call


# What a c10d store does, all defined once on the base class that every store (TCPStore,
# FileStore, HashStore, PrefixStore) inherits: set, get, add, ... (torch/csrc/distributed/c10d).
_STORE = torch._C._distributed_c10d.Store
_STORE_METHODS = ("set", "get", "add", "append", "compare_set", "multi_get", "multi_set", "wait",
                  "check", "delete_key", "num_keys", "list_keys", "queue_push", "queue_pop",
                  "queue_len", "barrier", "clone")
WHY_STORE = ("the store is where ranks find each other, not a channel for data: move tensors "
             "with collectives or send/recv")


@contextlib.contextmanager
def no_store():
    """While the block runs, every method of every c10d store raises ForbiddenCall (the default
    group's, `distributed_c10d._get_default_store()`, included), and so does making a TCPStore,
    FileStore or HashStore. Process groups use their store from C++, and go on working."""
    saved = [(_STORE, name, _STORE.__dict__[name]) for name in _STORE_METHODS
             if name in _STORE.__dict__]
    saved += [(kind, "__init__", kind.__dict__["__init__"]) for kind in _NEW_STORES]
    for kind, name, _ in saved:
        what = f"Store.{name}" if kind is _STORE else f"a new {kind.__name__}"
        setattr(kind, name, _store_refusal(what))
    try:
        yield
    finally:
        for kind, name, original in saved:
            setattr(kind, name, original)


# Stores a student could make to talk through (PrefixStore stays: dist.new_group makes one).
_NEW_STORES = (dist.TCPStore, dist.FileStore, dist.HashStore)


def _store_refusal(what):
    def refuse(*args, **kwargs):
        raise ForbiddenCall(f"used the c10d store ({what}), which this exercise does not allow: "
                            f"{WHY_STORE}")

    return refuse
