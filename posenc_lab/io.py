"""Files that a later command reads are written atomically, and read with a named error.

Every writer here writes to a temporary file in the target's directory, flushes it to disk and
renames it over the target (``os.replace`` is atomic on POSIX and Windows): a reader sees the old
file or the new one, never half of one, even after kill -9. Every reader raises
``CorruptFileError`` naming the file and what to do, instead of a library's bare exception.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import PosencLabError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class CorruptFileError(PosencLabError, ValueError):
    """A file the project wrote cannot be read back; the message names it and says what to do."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``, else delete it.

    >>> with atomic_path("out/table.csv") as tmp:
    ...     df.to_csv(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets the mode a plain open() would give
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the data reaches the disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    """``np.save`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, array)
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
