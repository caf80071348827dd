"""The bytes each rank received from the other ranks, counted by the Linux kernel on its TCP
connections, read from outside the ranks (issue 36).

A check that counts messages inside a rank (lesson 02's `CommCounter`) counts in the student's
own process, where a record can be cleared or faked. gloo moves every message of a CPU process
group over TCP connections between the ranks, and the kernel keeps, per socket, the bytes it
received (`tcp_info.tcpi_bytes_received`); `ss -tinp` (iproute2) prints them with each socket's
owner. `received(pids)` sums them over the connections whose two ends belong to two of the
given processes (the rendezvous store's connections, to the launcher, do not count), less the 8
bytes gloo's connection handshake sends, so what is left is what the ranks sent each other.
"""

import re
import shutil
import subprocess

HANDSHAKE = 8  # bytes the connecting side of a gloo pair sends before any message

_OWNER = re.compile(r"pid=(\d+),")
_RECEIVED = re.compile(r"bytes_received:(\d+)")


def received(pids):
    """{pid: bytes received from the other pids over TCP}, or None where `ss` is missing."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    done = subprocess.run([ss, "-tinpH"], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        return None
    sockets = [_socket(block) for block in re.split(r"\n(?=\S)", done.stdout)]
    sockets = [s for s in sockets if s is not None and s[0] in pids]
    local = {s[1]: s[0] for s in sockets}  # "addr:port" -> owner
    totals = dict.fromkeys(pids, 0)
    for pid, here, there, count in sockets:
        if local.get(there, pid) != pid:  # the other end is another rank's
            totals[pid] += max(0, count - HANDSHAKE)
    return totals


def _socket(block):
    """(owner pid, local end, peer end, bytes received) of one socket's lines from `ss`."""
    fields, owner = block.split(), _OWNER.search(block)
    if len(fields) < 5 or owner is None:
        return None
    count = _RECEIVED.search(block)
    return int(owner.group(1)), fields[3], fields[4], int(count.group(1)) if count else 0
