"""Child processes that a long command supervises (the training runs of ``ablate``, the trials of ``sweep``):
each in a session of its own, so that a Ctrl-C in the terminal reaches the supervisor alone (it passes one
signal on, and a run saves its step); each dying with the supervisor, even when it is killed, so that none
outlives it and holds its run directory's lock."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import IO

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child (Linux): SIGTERM when the parent dies, even by SIGKILL; the run then saves its step and stops."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv: list[str], env: dict[str, str], output: IO) -> subprocess.Popen:
    """Start ``argv`` with its output into ``output``, in a session of its own, dying with this process."""
    return subprocess.Popen(
        argv, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
    )


def stop(
    procs: Iterable[subprocess.Popen], signum: int = signal.SIGTERM, grace: float = 60.0, poll: Callable | None = None
) -> None:
    """Send ``signum`` to each process's group, give them ``grace`` seconds to save and exit (calling ``poll``
    between checks), then kill what still runs, and reap every one."""
    procs = [p for p in procs if p.poll() is None]
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signum)
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if poll is not None:
            poll()
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
