"""The watchdog behind `stepscope.lifeline`: run as a script (`python -I this_file ...`), never imported.

At end-of-file on its pipe (the supervisor died) it stops the guarded group and its leader's descendants in
other sessions: SIGTERM, `--grace-s`, SIGKILL. RELEASED on the pipe means a stop on purpose. Standard library
only, so it starts in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone

POLL_S = 1.0
"""How often the group's liveness and the supervisor's pid are looked at between reads."""
RELEASED = b"r"
"""What `stepscope.lifeline.Lifeline.release` writes before it closes the pipe: the group was
stopped on purpose. End-of-file without it means the supervisor died."""


def _live_stats() -> Iterator[tuple[int, int, int]]:
    """(pid, ppid, pgrp) of every live (non-zombie) process, from /proc/<pid>/stat."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()  # after the name: state, ppid, pgrp, ...
        except OSError:
            continue
        if fields[0] != "Z":
            yield int(entry), int(fields[1]), int(fields[2])


def _members(pgid: int) -> set[int]:
    """Live (non-zombie) processes of the group."""
    return {pid for pid, _, pgrp in _live_stats() if pgrp == pgid}


def _descendants(root: int) -> set[int]:
    """Every live process below `root`, by walking parent links in /proc."""
    parent = {pid: ppid for pid, ppid, _ in _live_stats()}
    found: set[int] = set()
    frontier = {root}
    while frontier:
        kids = {pid for pid, pp in parent.items() if pp in frontier and pid not in found}
        found |= kids
        frontier = kids
    return found


def _signal_all(pgid: int, pids: set[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    left.add(pid)
        except OSError:
            continue
    return left


def stop_everything(pgid: int, leader: int, grace_s: float) -> int:
    """SIGTERM the group and the leader's descendants, SIGKILL what is left after `grace_s`.
    Returns how many processes there were."""
    targets = _members(pgid) | _descendants(leader)
    _signal_all(pgid, targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        # new members may appear while the leader shuts down; the group signal reaches them
        if not (_members(pgid) | _alive(targets)):
            return len(targets)
        time.sleep(0.2)
    _signal_all(pgid, targets | _members(pgid), signal.SIGKILL)
    return len(targets)


def _note(log: str | None, text: str) -> None:
    if not log:
        return
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        with open(log, "a") as fh:
            fh.write(f"# stepscope watchdog {stamp}: {text}\n")
    except OSError:
        pass


def watch(fd: int, pgid: int, leader: int, supervisor: int, grace_s: float, log: str | None, what: str) -> int:
    released = False
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        data = os.read(fd, 4096) if ready else None
        if data and RELEASED in data:
            released = True
            why = f"its supervisor (pid {supervisor}) stopped it on purpose, but some of it still ran"
            break
        if data == b"":
            why = f"its supervisor (pid {supervisor}) is gone (lifeline closed)"
            break
        if os.getppid() != supervisor:
            why = f"its supervisor (pid {supervisor}) is gone (watchdog reparented)"
            break
        if not _members(pgid):
            return 0  # stopped on purpose, or died: nothing left to guard
    if released and not _members(pgid) and not _descendants(leader):
        return 0  # the usual end: the supervisor stopped all of it, and let go
    n = stop_everything(pgid, leader, grace_s)
    # The leader is sent SIGTERM by the kernel when the supervisor dies (`lifeline.spawn`), so
    # the group may be gone before this looks: still say why it ended, in its log.
    _note(log, f"{why}: stopped the {what}'s process group {pgid} ({n} process(es))" if n else
          f"{why}: the {what}'s process group {pgid} had already ended "
          "(on its parent-death signal, or on its own)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--pgid", type=int, required=True)
    ap.add_argument("--leader", type=int, required=True)
    ap.add_argument("--supervisor", type=int, required=True)
    ap.add_argument("--grace-s", type=float, default=10.0)
    ap.add_argument("--log", default=None)
    ap.add_argument("--what", default="server")
    a = ap.parse_args(argv)
    # The terminal's Ctrl-C and hang-up are the supervisor's to act on; the watchdog acts
    # only when the supervisor is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return watch(a.fd, a.pgid, a.leader, a.supervisor, a.grace_s, a.log, a.what)


if __name__ == "__main__":
    sys.exit(main())
