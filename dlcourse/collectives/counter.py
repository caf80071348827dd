"""Count the communication a rank does: every collective and send/recv, with its bytes (lesson 02).

    with CommCounter() as comm:
        dist.all_reduce(grad)                # torch's own collectives, async_op=True included
        ring_all_reduce(grad)                # the course's, recorded as what they are
    comm.records     # [CommRecord(op='all_reduce', nbytes=4096, group_size=4), ...]
    comm.bus_bytes() # bytes this rank moved over its link, by nccl-tests' bus factors

How it sees them: torch hands every operator call on this thread to the active
`TorchDispatchMode`, and torch's collectives are operators too (`c10d::allreduce_`, `c10d::send`,
...). So the counter sees a collective whichever Python function issued it, DDP's C++ reducer and
DTensor included, and it only reads the arguments: results do not change. Leaving the `with` block
ends the mode; nothing stays switched on.

The course's collectives (`ring.py`, `tree.py`) are built from send/recv. They open a record for
themselves (`recorded`), and the sends and receives they make land in that record's `inner` list
instead of `records`, so nothing is counted twice and lesson 02 can still add up the messages.
"""

import sys
import weakref
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from dlcourse.collectives.bus import bus_factor
from dlcourse.collectives.p2p import nbytes_of


@dataclass
class CommRecord:
    op: str  # "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", ...
    nbytes: int  # the payload nccl-tests calls "size": all_reduce the tensor, all_gather the full
    #              output, reduce_scatter the full input, send/recv the message
    group_size: int  # ranks in the group the op ran on
    algorithm: str = ""  # "" for torch's own op; "ring", "tree", "naive" for the course's
    peer: int | None = None  # send/recv: the other rank, numbered within the group
    inner: list = field(default_factory=list, repr=False)  # the course's ops: their send/recv

    def bus_bytes(self):
        """nbytes x the bus factor: what this op moves over one rank's link (`bus.bus_factor`)."""
        return self.nbytes * bus_factor(self.op, self.group_size)


class CommCounter(TorchDispatchMode):
    """Records, on this rank, every collective and point-to-point op made inside `with`."""

    def __init__(self):
        super().__init__()
        self.records = []  # CommRecords in call order
        self._open = []  # the course's collectives running now; their send/recv go inside them
        self.active = False

    @classmethod
    def _should_skip_dynamo(cls):
        # Recent torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable, which imports
        # torch._dynamo at the first op: over a second in every fresh rank process. Nothing here
        # is meant to be compiled.
        return False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _has_dtensor(types):  # modes run before tensor subclasses: let DTensor turn the op
            return NotImplemented  # into local ops and collectives, which then come back here
        kwargs = kwargs or {}
        record = record_of(func, args, kwargs)
        if record is not None:
            self.add(record)
        return func(*args, **kwargs)

    def add(self, record):
        (self._open[-1].inner if self._open else self.records).append(record)

    @contextmanager
    def opened(self, record):
        """Add `record`, and put what is recorded inside this block into its `inner` list."""
        self.add(record)
        self._open.append(record)
        try:
            yield record
        finally:
            self._open.pop()

    def bus_bytes(self):
        """Total over records of nbytes x bus factor: bytes each rank moved over its link."""
        return sum(r.bus_bytes() for r in self.records)

    def by_op(self):
        """{op: (calls, nbytes, bus bytes)} summed over the records, for a short table."""
        table = {}
        for r in self.records:
            calls, nbytes, bus = table.get(r.op, (0, 0, 0))
            table[r.op] = (calls + 1, nbytes + r.nbytes, bus + r.bus_bytes())
        return table

    def watch_ddp(self, ddp_model):
        """Record each gradient bucket's all-reduce of a `DistributedDataParallel` model (lesson 03).

        On CPU the counter sees DDP's all-reduces even without this (DDP's C++ reducer issues
        them from backward on this thread); watching labels them "ddp bucket" and also catches
        them where the reducer runs them elsewhere. The hook records the bucket, then all-reduces
        it exactly as DDP's default does (divide by the group size, sum), so gradients do not
        change. DDP takes one hook per model for its life:
        after this counter's `with` block the hook only all-reduces, and watching the same model
        again (from this counter or another) reuses it.
        """
        watch = getattr(ddp_model, "_dlcourse_comm_watch", None)
        if watch is None:
            watch = _DDPWatch(ddp_model.process_group)
            ddp_model.register_comm_hook(watch, _ddp_allreduce_hook)
            ddp_model._dlcourse_comm_watch = watch
        watch.counters.add(self)
        return ddp_model


class _DDPWatch:
    """The state DDP passes to the comm hook: its process group and who is listening."""

    def __init__(self, process_group):
        self.process_group = process_group
        self.counters = weakref.WeakSet()


def _ddp_allreduce_hook(watch, bucket):
    buffer = bucket.buffer()  # the bucket's gradients, flattened into one tensor
    record = CommRecord("all_reduce", nbytes_of(buffer), watch.process_group.size(), "ddp bucket")
    with ExitStack() as stack:
        for counter in [c for c in watch.counters if c.active]:
            stack.enter_context(counter.opened(record))  # the all-reduce itself lands inside
        return default_hooks.allreduce_hook(watch.process_group, bucket)


@contextmanager
def recorded(op, nbytes, group_size, algorithm):
    """Record a course collective in every counter active on this thread (used by ring.py and
    tree.py); the send/recv it makes go into the record's `inner` list."""
    counters = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, CommCounter)]
    record = CommRecord(op, nbytes, group_size, algorithm)
    with ExitStack() as stack:
        for counter in counters:
            stack.enter_context(counter.opened(record))
        yield record


# Torch's operators, as the dispatcher names them -> (op name, argument holding the payload,
# how many copies of it make nccl-tests' "size"). "group" means one per rank of the group:
# a gather's input is one rank's piece, its "size" the gathered whole.
_OPS = {
    "c10d::allreduce_": ("all_reduce", "tensors", 1),
    "c10d::allreduce_coalesced_": ("all_reduce", "tensors", 1),
    "c10d::_allgather_base_": ("all_gather", "output_tensor", 1),
    "c10d::allgather_": ("all_gather", "output_tensors", 1),
    "c10d::allgather_coalesced_": ("all_gather", "output_lists", 1),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", "outputs", 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "input_tensor", 1),
    "c10d::reduce_scatter_": ("reduce_scatter", "input_tensors", 1),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", "inputs", 1),
    "c10d::broadcast_": ("broadcast", "tensors", 1),
    "c10d::reduce_": ("reduce", "tensors", 1),
    "c10d::gather_": ("gather", "input_tensors", "group"),
    "c10d::scatter_": ("scatter", "output_tensors", "group"),
    "c10d::alltoall_": ("all_to_all", "input_tensors", 1),
    "c10d::alltoall_base_": ("all_to_all", "input", 1),
    "c10d::send": ("send", "tensors", 1),
    "c10d::recv_": ("recv", "tensors", 1),
    "c10d::recv_any_source_": ("recv", "tensors", 1),
    "c10d::barrier": ("barrier", None, 0),
    # Functional collectives (DTensor, torch.compile) name the group instead of passing it.
    "_c10d_functional::all_reduce": ("all_reduce", "input", 1),
    "_c10d_functional::all_reduce_": ("all_reduce", "input", 1),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", "inputs", 1),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", "input", "group"),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", "input", "group"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", "inputs", "group"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", "input", 1),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", "inputs", 1),
    "_c10d_functional::all_to_all_single": ("all_to_all", "input", 1),
    "_c10d_functional::broadcast": ("broadcast", "input", 1),
    "_c10d_functional::broadcast_": ("broadcast", "input", 1),
}


def _has_dtensor(types):
    dtensor = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    return dtensor is not None and dtensor.DTensor in types


def record_of(func, args, kwargs):
    """The CommRecord of one dispatched operator call, or None if it does not communicate."""
    schema = func._schema
    entry = _OPS.get(schema.name)
    if entry is None:
        return None
    op, payload, copies = entry
    named = {a.name: v for a, v in zip(schema.arguments, args)} | kwargs
    group_size = _group_size(named)
    nbytes = nbytes_of(named[payload]) if payload else 0
    nbytes *= group_size if copies == "group" else copies
    peer = named.get("dst", named.get("src"))
    return CommRecord(op, nbytes, group_size, peer=peer if op in ("send", "recv") else None)


def _group_size(named):
    if "process_group" in named:  # the dispatcher passes it boxed as a TorchScript object
        return dist.ProcessGroup.unbox(named["process_group"]).size()
    if "group_size" in named:
        return named["group_size"]
    return dist.distributed_c10d._resolve_process_group(named["group_name"]).size()

