"""The hang finder: the first collective or send/recv on which the ranks disagree (lesson 10,
`lessons/10_debugging.ipynb`).

A rank that waits for a collective its peers never make waits until the job's timeout; what it
was waiting for is lost with the process. So each rank writes every call as it makes it, before
the call can block: `CommTrace` is lesson 02's `CommCounter` that also appends each record to
its rank's file (one JSON line: op, bytes, the group's global ranks, the peer, the call site).
When the job fails, `find_hang` lines the ranks' sequences up, one stream per process group
(collectives) and per pair of ranks (send/recv), and names the first call that differs: a
rank with no such call, another op, or another size.

    dlcourse.debug.launch_traced(train, world_size=2, timeout=30)   # a notebook cell
    # raises RankTimeout (or RankError); error.hang_report says which call and which ranks

Under torchrun: `with CommTrace(folder): train()` on every rank; after the hang,
`print(find_hang(read_traces(folder)))`.
"""

import json
import os
import tempfile
import traceback
from dataclasses import dataclass

import torch.distributed as dist

import dlcourse
from dlcourse.collectives.counter import CommCounter
from dlcourse.errors import RankError

_SKIP = (os.sep + "torch" + os.sep, "contextlib.py", os.path.join("collectives", "counter.py"),
         os.path.join("debug", "hang.py"))  # frames that are not the caller's


class CommTrace(CommCounter):
    """A CommCounter that also writes each call to `folder`/rank<r>.jsonl as it is made."""

    def __init__(self, folder):
        super().__init__()
        self.rank = dist.get_rank()
        os.makedirs(folder, exist_ok=True)  # under torchrun every rank may be the first here
        self.file = open(os.path.join(folder, f"rank{self.rank}.jsonl"), "w", buffering=1)
        self._group = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._group = _group_ranks(func, args, kwargs or {})
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._group = None

    def add(self, record):
        super().add(record)
        group = self._group
        peer = group[record.peer] if group and record.peer is not None else record.peer
        self.file.write(json.dumps(dict(op=record.op, nbytes=record.nbytes, group=group,
                                        peer=peer, site=_call_site())) + "\n")  # a line: flushed

    def __exit__(self, *exc):
        self.file.close()
        return super().__exit__(*exc)


def _group_ranks(func, args, kwargs):
    """The global ranks of the process group a c10d op runs on, or None."""
    named = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
    if "process_group" in named:
        group = dist.ProcessGroup.unbox(named["process_group"])
    elif "group_name" in named:
        group = dist.distributed_c10d._resolve_process_group(named["group_name"])
    else:
        return None
    return dist.get_process_group_ranks(group)


def _call_site():
    """file:line (function) of the innermost frame outside torch and the tracer."""
    for frame in reversed(traceback.extract_stack()):
        if not any(part in frame.filename for part in _SKIP):
            return f"{_short(frame.filename)}:{frame.lineno} ({frame.name})"
    return "?"


def _short(path):
    """dlcourse/parallel/data/steps.py for the library's files, the file's name for others."""
    parts = path.split(os.sep)
    return os.sep.join(parts[parts.index("dlcourse"):]) if "dlcourse" in parts else parts[-1]


def read_traces(folder):
    """{rank: [call dicts in call order]} from a folder of CommTrace files."""
    traces = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name.endswith(".jsonl"):
            with open(os.path.join(folder, name)) as f:
                traces[int(name[4:-6])] = [json.loads(line) for line in f if line.strip()]
    return traces


@dataclass
class Mismatch:
    stream: str  # "collectives on ranks [0, 1]" or "send/recv 0 -> 1"
    index: int  # the call's number in that stream, counted from 1 as torch's flight recorder
    #             counts a group's collectives (`collective_seq_id`); the course's one convention
    calls: dict  # rank -> the call dict it made there, or None (it made none)
    last: dict  # rank -> its last call of all (what a rank without this call did instead)

    def __str__(self):
        lines = [f"hang finder: the ranks disagree on call {self.index} of the {self.stream}:"]
        for rank, call in sorted(self.calls.items()):
            if call is None:
                before = self.last.get(rank)
                did = f"its last call was {_show(before)}" if before else "it made no call at all"
                lines.append(f"  rank {rank}: made no such call ({did})")
            else:
                lines.append(f"  rank {rank}: {_show(call)}")
        return "\n".join(lines)


def _show(call):
    group = f" on ranks {call['group']}" if call.get("group") else ""
    peer = f" with rank {call['peer']}" if call.get("peer") is not None else ""
    return f"{call['op']} of {call['nbytes']} B{group}{peer} at {call['site']}"


def find_hang(traces):
    """The first Mismatch over the streams of `traces` ({rank: [calls]}), or None if every stream
    agrees. "First": the mismatch that comes earliest in some rank's own sequence."""
    found = []
    for stream, per_rank in _streams(traces).items():
        mismatch = _first_difference(stream, per_rank)
        if mismatch is not None:
            order = min(c["_position"] for c in mismatch.calls.values() if c is not None)
            found.append((order, mismatch))
    if not found:
        return None
    mismatch = min(found, key=lambda f: f[0])[1]
    mismatch.last = {r: (calls[-1] if calls else None) for r, calls in traces.items()}
    return mismatch


def _streams(traces):
    """{stream name: {rank: [calls]}}: collectives by group; a's sends to b beside b's recvs."""
    streams = {}
    for rank, calls in traces.items():
        for position, call in enumerate(calls):
            call = dict(call, _position=position)
            if call["op"] in ("send", "recv") and call.get("peer") is not None:
                src, dst = (rank, call["peer"]) if call["op"] == "send" else (call["peer"], rank)
                key, members = f"send/recv {src} -> {dst}", (src, dst)
            elif call["op"] in ("send", "recv"):
                continue  # a course collective's inner message without its group: skipped
            else:
                members = tuple(call["group"] or sorted(traces))
                key = f"collectives on ranks {list(members)}"
            stream = streams.setdefault(key, {r: [] for r in members})
            stream.setdefault(rank, []).append(call)
    return streams


def _first_difference(stream, per_rank):
    for index in range(max(len(c) for c in per_rank.values())):
        calls = {r: (c[index] if index < len(c) else None) for r, c in per_rank.items()}
        made = [(c["op"] if not stream.startswith("send") else "p2p", c["nbytes"])
                for c in calls.values() if c is not None]
        if len(made) < len(calls) or len(set(made)) > 1:
            return Mismatch(stream, index + 1, calls, {})
    return None


def _traced(fn, folder, *args, **kwargs):
    with CommTrace(folder):
        return fn(*args, **kwargs)


def launch_traced(fn, *args, world_size=2, timeout=30, folder=None, **kwargs):
    """`dlcourse.launch(fn, *args, ...)` with every rank's calls traced into `folder` (kept), or
    into a temporary folder removed afterwards. If the job fails or times out, the launch's
    RankError or RankTimeout carries `hang_report` (a Mismatch, or None) and its message ends
    with it."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="dlcourse-trace-") as temporary:
            return launch_traced(fn, *args, world_size=world_size, timeout=timeout,
                                 folder=temporary, **kwargs)
    try:
        return dlcourse.launch(_traced, fn, folder, *args, world_size=world_size,
                               timeout=timeout, **kwargs)
    except RankError as error:
        error.hang_report = find_hang(read_traces(folder))
        if error.hang_report is not None:
            error.args = (f"{error.args[0]}\n\n{error.hang_report}",) + error.args[1:]
        raise
