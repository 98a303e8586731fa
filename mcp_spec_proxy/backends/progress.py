"""Whether the backends still in their handshake are working: what our child processes are doing.

At start-up the proxy cannot tell a backend that is slow to start from one that hangs in its
handshake by what it says (neither says anything yet). What it does tells them apart: a server
that is importing its modules or loading its code is on a CPU, waiting for one, or reading from
disk; one that waits forever (for its stdin, a network peer, a lock) is asleep and stays asleep,
and so is a connected server waiting for requests.

`snapshot()` reads, for every thread of every process below this one, the nanoseconds it has
spent on a CPU plus those spent runnable but waiting for one (`/proc/<pid>/task/<tid>/schedstat`)
and whether it is runnable or in uninterruptible (disk) sleep right now. `busy(before, after,
window)` compares two snapshots. The waiting time matters on a loaded machine: a starting server
that shares two cores with ten others spends most of its time waiting for a CPU, which CPU time
alone would read as quiet. Nanosecond counts make a short window enough (`PRECISE_WINDOW_S`).

Where schedstat cannot be read, CPU time in clock ticks (`/proc/<pid>/stat`) stands in, which
needs a longer window (`COARSE_WINDOW_S`); without /proc (not Linux), `snapshot()` is None and
only the window decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_PROC = Path("/proc")

PRECISE_WINDOW_S = 0.05
"""How long the backends still starting must look quiet, read from schedstat (nanoseconds)."""
COARSE_WINDOW_S = 0.2
"""The same, read from CPU time in clock ticks (10 ms each): a longer look is needed."""
BUSY_SHARE = 0.1
"""Work of this share of one core, or more, in the window (on a CPU or waiting for one): busy."""


@dataclass(frozen=True)
class Snapshot:
    precise: bool  # nanoseconds from schedstat (True) or clock ticks from stat (False)
    spent: dict[int, int] = field(default_factory=dict)  # thread id -> ns (or ticks) spent or waited
    active: bool = False  # some thread was runnable or in disk sleep when read
    reaped: int = 0  # ticks of children already waited for (ours, through cutime and cstime)

    @property
    def window(self) -> float:
        return PRECISE_WINDOW_S if self.precise else COARSE_WINDOW_S


def snapshot(root: int | None = None) -> Snapshot | None:
    """What the threads of every process below `root` (default: this process) have done so far,
    or None where /proc cannot be read."""
    root = os.getpid() if root is None else root
    try:
        entries = [entry for entry in os.listdir(_PROC) if entry.isdigit()]
    except OSError:
        return None
    parent_of: dict[int, int] = {}
    reaped = 0
    for entry in entries:
        fields = _stat_fields(_PROC / entry / "stat")
        if fields is None:
            continue  # it ended while we looked
        pid = int(entry)
        parent_of[pid] = int(fields[1])
        if pid == root:
            reaped = int(fields[13]) + int(fields[14])  # cutime, cstime: children already waited for
    below = [pid for pid in parent_of if pid != root and _below(pid, root, parent_of)]
    precise = (_PROC / str(root) / "schedstat").exists()
    spent: dict[int, int] = {}
    active = False
    for pid in below:
        try:
            tids = [int(tid) for tid in os.listdir(_PROC / str(pid) / "task")]
        except OSError:
            continue
        for tid in tids:
            task = _PROC / str(pid) / "task" / str(tid)
            fields = _stat_fields(task / "stat")
            if fields is None:
                continue
            active = active or fields[0] in ("R", "D")
            if precise:
                try:
                    on_cpu, waited = (task / "schedstat").read_text().split()[:2]
                except (OSError, ValueError):
                    continue
                spent[tid] = int(on_cpu) + int(waited)
            else:
                spent[tid] = int(fields[11]) + int(fields[12])  # utime, stime
    return Snapshot(precise, spent, active, reaped)


def busy(before: Snapshot | None, after: Snapshot | None, window: float) -> bool:
    """Whether the processes below us worked between two snapshots `window` seconds apart: a
    thread runnable or in disk sleep at the second look, a process or thread started or ended
    between them, or work (on a CPU or waiting for one) of `BUSY_SHARE` of a core or more."""
    if before is None or after is None:
        return False
    if after.active or set(before.spent) != set(after.spent) or after.reaped != before.reaped:
        return True
    work = sum(after.spent[tid] - before.spent[tid] for tid in after.spent)
    unit = 1e9 if after.precise else os.sysconf("SC_CLK_TCK")
    return work / unit >= BUSY_SHARE * window


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (state first), or None if gone."""
    try:
        stat = path.read_bytes()
    except OSError:
        return None
    # The command name is the process's own bytes (any, UTF-8 or not, spaces and parentheses
    # too) and is never decoded: the fields start after the last ")" and are ASCII.
    _, paren, fields = stat.rpartition(b")")
    return fields.decode("ascii", "replace").split() if paren else None


def _below(pid: int, root: int, parent_of: dict[int, int]) -> bool:
    seen = 0
    while pid in parent_of and seen < 64:
        pid = parent_of[pid]
        if pid == root:
            return True
        seen += 1
    return False
