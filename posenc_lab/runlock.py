"""``.lock``: the pid and host of the process writing a folder (a run directory, or an ablation's ``ablate.out``),
under an OS lock (flock) that the kernel drops when the process dies: a second process is refused while the first
runs, and a lock file left by a killed process is taken over (with a warning naming the dead pid)."""

from __future__ import annotations

import datetime
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from .errors import RunDirError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def lock_not_a_file(lock: Path) -> str:
    what = "folder" if lock.is_dir() else "link to nothing" if lock.is_symlink() else "special file"
    return f"{lock} is a {what}, not the run's lock file (posenc-lab writes it); remove it and rerun"


class RunLock:
    """``with RunLock(run_dir):`` -- this process alone writes the run (see the module docstring). ``key``: the
    setting that named the folder, in the messages (another folder that one process writes: ``ablate.out``)."""

    def __init__(self, run_dir: Path, key: str = "run_dir"):
        self.path = Path(run_dir) / LOCK_FILE
        self.key = key
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except (IsADirectoryError, FileNotFoundError):
                raise RunDirError(lock_not_a_file(self.path)) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunDirError(
                        f"{self.key} {self.path.parent} is being written by another process ({holder}); "
                        f"wait for it to finish or use another {self.key}"
                    ) from None
                raise RunDirError(
                    f"cannot lock {self.path} ({e}); this file system does not support file "
                    f"locks: put {self.key} on a local or lockable file system"
                ) from e
            try:  # the holder may have removed the file between our open and flock: lock the new one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous:
            log.warning(
                "%s %s: taking over the lock left by a process that no longer runs (%s)",
                self.key,
                self.path.parent,
                previous,
            )
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"pid {os.getpid()} on {socket.gethostname()} since "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}\n".encode(),
            0,
        )
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
