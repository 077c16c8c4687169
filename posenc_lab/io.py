"""Files that a later command reads are written atomically, and read with a named error.

Every writer here writes to a temporary file in the target's directory, flushes it to disk and
renames it over the target (``os.replace`` is atomic on POSIX and Windows): a reader sees the old
file or the new one, never half of one, even after kill -9, and the target's name always points at a
new file (never at a file that something else links to). A full disk raises ``DiskFullError`` naming
the file and the file system, with the old file intact. Every reader raises ``CorruptFileError``
naming the file and what to do, instead of a library's bare exception.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PosencLabError, no_space


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class CorruptFileError(PosencLabError, ValueError):
    """A file the project wrote cannot be read back; the message names it and says what to do."""


class DiskFullError(PosencLabError, OSError):
    """No space left (or the quota reached) while writing a file; the message names the file and its file system."""


def disk_full(path: Path) -> DiskFullError:
    mount = path.parent.resolve()
    while not os.path.ismount(mount):
        mount = mount.parent
    free = shutil.disk_usage(mount).free
    return DiskFullError(
        f"no space left on the file system at {mount} ({free / 2**20:.1f} MiB free) to write {path}: it was not "
        f"written, and the file it would replace (if any) is intact. Free space there, then rerun the same command"
    )


def path_problem(path: str | os.PathLike, key: str) -> str | None:
    """Why ``path`` cannot be a folder a command creates and writes into, naming ``key`` (the setting that gave
    it) and the fix; None if it can. Checked before anything is created, so that a bad path is one line, not
    a traceback from the first mkdir."""
    path = Path(os.path.abspath(path))
    for part in path.parts:
        if len(os.fsencode(part)) > 255:  # NAME_MAX of every common file system
            n = len(os.fsencode(part))
            return f"{key}: the name {part[:24]}... in it is {n} bytes long, a file system takes 255; use a shorter one"
    for prefix in (*reversed(path.parents), path):
        if os.path.islink(prefix) and not os.path.exists(prefix):
            try:
                os.stat(prefix)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    return f"{key}={path}: {prefix} is a loop of symbolic links; remove it or use another {key}"
            return (
                f"{key}={path}: {prefix} is a symbolic link to {os.readlink(prefix)}, which does not exist; "
                f"create it or use another {key}"
            )
        if not os.path.exists(prefix):
            parent = prefix.parent
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{key}={path}: cannot create {prefix.name} in {parent} (no permission); use another {key}"
            try:  # root passes access() everywhere, also where nothing can be created (/proc, a read-only mount)
                os.rmdir(tempfile.mkdtemp(prefix=".posenc-lab-probe-", dir=parent))
            except OSError as e:
                return f"{key}={path}: cannot create {prefix.name} in {parent} ({e.strerror}); use another {key}"
            return None
        if not os.path.isdir(prefix):
            return f"{key}={path}: {prefix} is a file, not a folder; use another {key}"
    return None if os.access(path, os.W_OK | os.X_OK) else f"{key}={path}: cannot write in {path} (no permission)"


_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._+=-]")
_NAME_PART_MAX = 64  # a file name is several parts; 255 bytes in all


def safe_name(value: Any) -> str:
    """``value`` (an option's key or value, given by a user) as a part of a file name: characters other than
    letters, digits and ``._+=-`` (a ``/`` above all) become ``-``. If that changed anything, or the part is empty,
    ``.``, ``..`` or long, a hash of the original follows (``x-..-tmp-evil-3f2a9c1e``), so that two values never
    share a name; plain values stay as they are (``yarn``, ``4.0``, ``-1``)."""
    text = str(value)
    safe = _UNSAFE_IN_NAME.sub("-", text)
    if safe == text and safe not in ("", ".", "..") and len(safe) <= _NAME_PART_MAX:
        return safe
    return f"{safe[:_NAME_PART_MAX]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def inside(folder: str | os.PathLike, name: str) -> Path:
    """``folder / name``, or ValueError if that would not be a file directly in ``folder`` (a ``/`` or ``..`` in
    ``name``)."""
    path = Path(folder) / name
    if not name or Path(name).name != name or name in (".", ".."):
        raise ValueError(f"the file name {name!r} would leave its folder {folder}")
    return path


# Temporary files of the writers below (``.<name>.<random>.tmp<suffix>``, checkpoints._link's ``.<name>.tmp``):
# left behind only by a killed process.
PARTIAL_GLOBS = (".*.tmp", ".*.tmp.*")


def remove_partial(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a killed writer left in ``directory`` (call it while no other process writes
    there, e.g. under the run's lock); returns them."""
    directory = Path(directory)
    found = [p for g in PARTIAL_GLOBS for p in directory.glob(g) if p.is_file()] if directory.is_dir() else []
    for p in found:
        p.unlink(missing_ok=True)
    return found


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``, else delete it.
    A full disk raises DiskFullError naming ``path``.

    >>> with atomic_path("out/table.csv") as tmp:
    ...     df.to_csv(tmp)
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the mode a plain open() would give
        yield tmp
        with open(tmp, "rb+") as f:  # the data reaches the disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and not isinstance(e, DiskFullError) and no_space(e):
            raise disk_full(path) from e
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2) + "\n")


def save_npz(path: str | os.PathLike, **arrays: Any) -> Path:
    """``np.savez_compressed`` atomically (numpy would append ``.npz`` to a name without it)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    return Path(path)


def save_npy(path: str | os.PathLike, array: Any) -> Path:
    """``np.save`` atomically (the same bytes). The data go through ``file.write``: numpy's ``tofile`` reports a
    full disk as an OSError without its errno, which would not be known for one."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
            f.write(memoryview(array).cast("B"))
    return Path(path)


def write_with(path: str | os.PathLike, writer: Callable[[Path], Any]) -> Path:
    """Atomically write ``path`` with any function that writes a file name, e.g.
    ``write_with(p, lambda t: df.to_csv(t, index=False))`` or ``write_with(p, fig.savefig)``."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)


def _corrupt(path: Path, e: Exception, remedy: str) -> CorruptFileError:
    return CorruptFileError(f"{path} is corrupt or truncated ({type(e).__name__}: {e}); {remedy}")


def read_json(path: str | os.PathLike, remedy: str = "delete it and rerun the command that wrote it") -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise _corrupt(path, e, remedy) from e


def load_npz(
    path: str | os.PathLike, remedy: str = "delete it and rerun the command that wrote it"
) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, loaded eagerly (so that truncation shows here, not later)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError) as e:
        raise _corrupt(path, e, remedy) from e
    except Exception as e:  # zipfile.BadZipFile, zlib.error: numpy lets them through
        raise _corrupt(path, e, remedy) from e
