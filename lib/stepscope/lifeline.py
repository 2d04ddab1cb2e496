"""A child process tree that dies with the process that started it, however that one dies.

`kill -9` skips every handler, but the kernel closes a dead process's file descriptors: a watchdog
(`lifeline_watchdog.py`) reading a pipe whose only write end the supervisor holds stops the guarded group at
end-of-file. `PR_SET_PDEATHSIG` covers the milliseconds before the watchdog is up (docs/faults.md).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

WATCHDOG_SCRIPT = Path(__file__).with_name("lifeline_watchdog.py")
SUPERVISOR_ENV = "STEPSCOPE_SUPERVISOR"
"""Set in a guarded process's environment: `<pid>:<start time>` of its supervisor, so that a
process left behind by a supervisor that is gone can be told from anyone else's."""
RUN_DIR_ENV = "STEPSCOPE_RUN_DIR"
"""Set beside SUPERVISOR_ENV for a run's server: the run folder that launched it."""
RELEASED = b"r"
"""Written on the pipe by `Lifeline.release` before it closes it (`lifeline_watchdog.RELEASED`
is the same byte: the watchdog imports nothing of stepscope)."""
PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What a spawned leader gets when its parent dies. Not SIGKILL: the leader then stops its own
children (vLLM its engine and workers, JupyterLab its kernels), and while it does, the
watchdog can still find the ones that left the group by walking down from it."""
_PR_SET_PDEATHSIG = 1

_HELD: dict[int, "Lifeline"] = {}
"""Open lifelines by guarded pgid. Held here, not only by their callers: a lifeline dropped
and garbage-collected would close its pipe and stop the server it guards."""


@dataclass
class Lifeline:
    pgid: int
    watchdog: subprocess.Popen
    write_fd: int

    def release(self) -> None:
        """The group was stopped on purpose: say so on the pipe, close it, and let the
        watchdog exit."""
        _HELD.pop(self.pgid, None)
        if self.write_fd >= 0:
            # End-of-file alone would read as "the supervisor died"; the byte before it tells
            # the watchdog this stop was meant: it stops, and notes, only what the stop missed.
            try:
                os.write(self.write_fd, RELEASED)
            except OSError:
                pass  # the watchdog already left (its group had died): nothing to tell
            os.close(self.write_fd)
            self.write_fd = -1
        try:
            self.watchdog.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()


def supervisor_stamp(pid: int | None = None) -> str:
    """`<pid>:<start time>` of a process (this one by default)."""
    pid = pid or os.getpid()
    return f"{pid}:{process_start_time(pid) or 0:.2f}"


def process_start_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - psutil missing or the process gone
        return None


def stamp_alive(stamp: str | None) -> bool | None:
    """Whether the process a `supervisor_stamp` names still runs (None: no stamp to judge).
    A pid recycled for another process has another start time, and counts as gone."""
    if not stamp:
        return None
    try:
        pid_text, _, born_text = stamp.partition(":")
        pid, born = int(pid_text), float(born_text or 0)
    except ValueError:
        return None
    now_born = process_start_time(pid)
    if now_born is None:
        return False
    return not born or abs(now_born - born) < 1.0


def spawn(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """Start `argv` as the leader of a new session and process group that is sent
    PARENT_DEATH_SIGNAL when this process dies (Linux; elsewhere only the watchdog guards
    it). The caller then `guard`s the group."""
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=parent_death_signal(), **popen_kwargs)


def parent_death_signal(sig: int = PARENT_DEATH_SIGNAL) -> Callable[[], None] | None:
    """A `preexec_fn` arming the kernel's parent-death signal in the child, or None (not Linux, no libc, or
    not the main thread: the signal fires when the forking thread ends)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child should only call it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    # Built here: between fork and exec the child does as little as it can (other threads'
    # locks are frozen in it). prctl is variadic; the kernel reads unsigned longs.
    args = (ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0),
            ctypes.c_ulong(0))

    def arm() -> None:
        prctl(*args)  # a refusal (a seccomp filter) leaves the watchdog alone to guard the child
        # A parent that died between the fork and the line above sends no signal: go now.
        if os.getppid() != parent:
            os._exit(1)

    return arm


def guard(pgid: int, *, leader: int | None = None, log_path: str | Path | None = None,
          grace_s: float = 10.0, what: str = "server") -> Lifeline:
    """Start the watchdog for process group `pgid` (its leader `leader`, by default the
    same pid); it stops the group when this process dies."""
    read_fd, write_fd = os.pipe()  # both non-inheritable; the read end is passed explicitly
    argv = [sys.executable, "-I", str(WATCHDOG_SCRIPT), "--fd", str(read_fd), "--pgid", str(pgid),
            "--leader", str(leader or pgid), "--supervisor", str(os.getpid()), "--grace-s", str(grace_s),
            "--what", what]
    if log_path:
        argv += ["--log", str(log_path)]
    try:
        proc = subprocess.Popen(argv, pass_fds=(read_fd,), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    line = Lifeline(pgid=pgid, watchdog=proc, write_fd=write_fd)
    _HELD[pgid] = line
    return line


def release(pgid: int | None) -> None:
    """Release the lifeline of group `pgid`, if this process holds one."""
    line = _HELD.get(int(pgid)) if pgid else None
    if line is not None:
        line.release()


def held(pgid: int) -> Lifeline | None:
    return _HELD.get(int(pgid))
