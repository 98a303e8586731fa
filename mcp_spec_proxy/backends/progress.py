"""Whether the backends still in their handshake are working: the CPU time of our child processes.

At start-up the proxy cannot tell a backend that is slow to start from one that hangs in its
handshake by what it says (neither says anything yet). What it does tells them apart: a server
that is importing its modules or loading its code burns CPU; one that waits forever does not;
a connected server waiting for requests does not either. `descendants_cpu_s()` is the CPU time
spent so far by every process below this one (children, their children, and the children this
one has already reaped); `BackendPool.ready` keeps waiting while it grows.

Linux reads it from /proc; elsewhere it is None and only the grace period decides.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def descendants_cpu_s(root: int | None = None) -> float | None:
    """CPU seconds (user + system) of the processes below `root` (default: this process), or None
    where /proc cannot be read."""
    root = os.getpid() if root is None else root
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        entries = [entry for entry in os.listdir(_PROC) if entry.isdigit()]
    except (OSError, ValueError):
        return None
    parent_of: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in entries:
        try:
            stat = (_PROC / entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # The command name may hold spaces and parentheses: the fields start after the last ")".
        fields = stat.rsplit(")", 1)[1].split()
        pid = int(entry)
        parent_of[pid] = int(fields[1])
        reaped = int(fields[13]) + int(fields[14])  # cutime, cstime: its children already waited for
        spent[pid] = reaped if pid == root else int(fields[11]) + int(fields[12]) + reaped
    total = 0
    for pid, ticks_spent in spent.items():
        if pid == root or _below(pid, root, parent_of):
            total += ticks_spent
    return total / ticks


def _below(pid: int, root: int, parent_of: dict[int, int]) -> bool:
    seen = 0
    while pid in parent_of and seen < 64:
        pid = parent_of[pid]
        if pid == root:
            return True
        seen += 1
    return False
