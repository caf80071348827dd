"""Refusing the answer while a student's function runs, however the student reaches it.

A check that asks for `ring_all_reduce` or `model_state_bytes` must not pass a function that
calls the library's own. Three ways in, three guards (all undone when the check ends):
- `replaced(namespaces, [(library_function, refusal(...))])`: the library function's code is
  swapped for code that raises `ForbiddenCall`. Every name, alias, default argument or module
  that holds the function holds the same function object, so every one of them now refuses; the
  names bound to other objects (a class, a table) in `namespaces` are rebound to the stand-in.
  A copy of the function made before the check (`types.FunctionType(f.__code__, ...)`, or one
  rebuilt by pickling) is found by `copies_in(fn)`, which follows what the student's function
  refers to and compares code objects; one made while the student's code runs (the library
  file's text read and exec'd) is refused when it is called (`copies_refused`, a profile hook).
- `forbidden(names, why)`: torch.distributed's functions of those names raise, and so does the
  collective itself when it reaches torch's dispatcher by another road (a `ProcessGroup`
  method, the functional collectives), which lesson 02's `CommCounter` also watches.
- `no_store()`: every c10d store refuses to be read or written (the default group's, or a
  TCPStore the student makes): data between ranks goes through collectives or send/recv, which
  a check can count, not through the rendezvous's key-value store.
"""

import contextlib
import types

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from dlcourse.collectives.counter import record_of


class ForbiddenCall(RuntimeError):
    """Raised inside a rank when the student calls a function the exercise forbids."""


def refusal(what, why, verb="called"):
    """A stand-in that raises ForbiddenCall: '<verb> <what>, which this exercise does not
    allow: <why>'. Its `message` is what it says."""
    message = f"{verb} {what}, which this exercise does not allow: {why}"
    refuse = types.FunctionType(_refusing_code(_raise_forbidden, message), {}, "refuse")
    refuse.message = message  # no closure: a copy of the stand-in refuses too
    return refuse


def _raise_forbidden(*args, **kwargs):  # its code, with the message swapped in, is what runs
    raise __import__("dlcourse.checks.core.refuse", fromlist=["ForbiddenCall"]).ForbiddenCall(
        "MESSAGE")


def _refusing_code(original, message):
    code = _raise_forbidden.__code__
    consts = tuple(message if c == "MESSAGE" else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_name=original.__code__.co_name,
                        co_qualname=original.__code__.co_qualname)


class Refused:
    """What a `replaced` block refuses: the library functions' original code objects."""

    def __init__(self):
        self.codes = []  # [(original code object, message)]

    def copies_in(self, fn, depth=3):
        """The message of a refused function that `fn` holds a copy of (a function object with
        the same code that is not the swapped original), or None. For a class (a student's
        autograd Function), what its own methods hold."""
        seen = set()
        roots = ([getattr(a, "__func__", a) for a in vars(fn).values()]
                 if isinstance(fn, type) else [fn])
        for code in (c for root in roots for c in _codes_reached(root, depth, seen)):
            for original, message in self.codes:
                if code == original:
                    return message
        return None


@contextlib.contextmanager
def replaced(namespaces, replacements):
    """While the block runs, each `replacements` original refuses: a function by its code, and
    every name in `namespaces` (module dicts, a student's globals) bound to one is bound to its
    stand-in; then all is put back. Yields a `Refused` (for `copies_in`).

    replacements: [(original object, stand-in)], matched by identity.
    """
    stand_ins = {id(original): stand_in for original, stand_in in replacements}
    saved = [(ns, key, value) for ns in namespaces for key, value in list(ns.items())
             if id(value) in stand_ins]
    refused, swapped, seen = Refused(), [], set()
    for original, stand_in in replacements:
        message = getattr(stand_in, "message", None)
        if id(original) in seen:  # listed twice: swapping again would save the refusing code
            continue
        seen.add(id(original))
        if isinstance(original, types.FunctionType) and message and not original.__closure__:
            refused.codes.append((original.__code__, message))
            swapped.append((original, original.__code__))
            original.__code__ = _refusing_code(original, message)
    for ns, key, value in saved:
        ns[key] = stand_ins[id(value)]
    try:
        yield refused
    finally:
        for ns, key, value in saved:
            ns[key] = value
        for original, code in reversed(swapped):
            original.__code__ = code


def _codes_reached(fn, depth, seen):
    """The code objects of the functions `fn` refers to (globals it names, defaults, closure
    cells, functions nested in it), `depth` references deep; fn's own code included."""
    if not isinstance(fn, types.FunctionType) or id(fn) in seen or depth < 0:
        return
    seen.add(id(fn))
    yield fn.__code__
    refs = [fn.__globals__.get(name) for name in _names(fn.__code__)]
    refs += list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    refs += [cell.cell_contents for cell in fn.__closure__ or () if _filled(cell)]
    for ref in refs:
        yield from _codes_reached(ref, depth - 1, seen)


def _names(code):
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _filled(cell):
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- communication

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
    # dist.all_reduce and c10d.all_reduce are one function under two names: guard both.
    saved = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in names if hasattr(m, n)]
    guards = {}  # one stand-in for both names, as torch has one function
    for module, name, original in saved:
        setattr(module, name, guards.setdefault(id(original), _guard(name, why)))
    ops = {_DISPATCHED_AS.get(n, n) for n in names}
    try:
        with (_RefuseOps(ops, why) if ops else contextlib.nullcontext()):
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


@contextlib.contextmanager
def none_named():
    """While the block runs, a torch.distributed call given None where a tensor goes fails with
    one line that says so (torch's own message puts the 'got None' on its second line, which a
    gradebook does not keep)."""
    saved = [(m, n, getattr(m, n)) for m in (dist, c10d) for n in _TAKE_TENSORS if hasattr(m, n)]
    wrappers = {}  # dist.all_reduce is c10d.all_reduce: one wrapper for both names
    for module, name, original in saved:
        setattr(module, name, wrappers.setdefault(id(original), _none_check(name, original)))
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


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
