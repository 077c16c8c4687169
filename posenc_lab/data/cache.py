"""The cache of prepared corpora: a folder per set of preparation settings, arrays as .npy files read
back as read-only memmaps, and a manifest written last (a half-written cache is rebuilt, never trusted).

The manifest holds a digest (``DIGEST``) of every file of its entry, checked on every load: a file whose
content is not what was written (other tokens of the same length, say) is refused in one line naming the
file and the folder to delete. A file that cannot be read at all (truncated, corrupted) is named in a warning
and the entry is built again from its source; so is an entry without digests (written by an older
posenc-lab: its content cannot be vouched for, and a build from the same source gives the same tokens).
A cache that cannot be written (a file, a read-only file system, a full disk) is one line before the build.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import PosencLabError, no_space
from ..io import disk_full, save_npy, write_json, write_text
from .splits import SPLITS

CACHE_ENV = "POSENC_LAB_CACHE"
DEFAULT_CACHE = Path("~/.cache/posenc_lab")
#: hashlib's name of the files' digest: BLAKE2b hashes twice as fast as SHA-256 on a CPU without SHA extensions
DIGEST = "blake2b"
MANIFEST = "manifest.json"
log = logging.getLogger("posenc_lab.data")


class CacheContentError(PosencLabError, ValueError):
    """A cache file reads, but its content is not what its manifest says was written."""


class CacheUnwritable(PosencLabError, OSError):
    """The cache must be written (a corpus is prepared) and cannot be; the message names the folder and why."""


def cache_root(root: str | os.PathLike | None = None) -> Path:
    """The cache directory: `root` if given, else $POSENC_LAB_CACHE, else ~/.cache/posenc_lab."""
    if root is None:
        root = os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(root).expanduser()


def cache_setting(root: str | os.PathLike | None = None) -> str:
    """The setting that chose ``cache_root(root)``, as an error names it: ``data.root=...``, ``$POSENC_LAB_CACHE=...``
    or the default."""
    if root is not None:
        return f"data.root={cache_root(root)}"
    if os.environ.get(CACHE_ENV):
        return f"${CACHE_ENV}={cache_root()}"
    return f"the default cache {cache_root()} (data.root and ${CACHE_ENV} unset)"


def key_dir(base: Path, key: dict) -> Path:
    """A cache directory per set of preparation settings."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return base / digest


def file_digest(path: Path) -> str:
    """The hex ``DIGEST`` of a file's bytes."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, DIGEST).hexdigest()


def check_writable(directory: Path) -> None:
    """CacheUnwritable unless ``directory`` can be created (or is a folder) and written in, by this process."""
    folder = Path(os.path.abspath(directory))
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if folder.is_symlink() and not folder.exists():
        problem = f"{folder} is a symbolic link to {os.readlink(folder)}, which does not exist"
    elif not folder.is_dir():
        problem = f"{folder} is a file, not a folder"
    elif os.access(folder, os.W_OK | os.X_OK):  # access() also says no for a read-only mount, root included
        return
    elif os.statvfs(folder).f_flag & os.ST_RDONLY:
        problem = f"{folder} is on a read-only file system"
    else:
        problem = f"no permission to write in {folder}"
    raise CacheUnwritable(f"cannot write the corpus cache {directory}: {problem}")


class _Rebuild(Exception):
    """The entry must be built again; ``args[0]`` says why (for the warning)."""


def _read(directory: Path, key: dict):
    """(arrays, itos, info) of a complete cache entry, None if there is none or it is from other settings;
    _Rebuild if it is damaged or has no digests; CacheContentError if a file holds other content."""
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:  # ``path``: the file being read, named in the warning
        manifest = json.loads(path.read_text())
        if manifest.get("key") != key:
            return None
        if DIGEST not in manifest:
            raise _Rebuild("has no content digests (an older posenc-lab wrote it): preparing the corpus again")
        arrays = {}
        for name, n in manifest["n_tokens"].items():
            path = directory / f"{name}.npy"
            array = np.load(path, mmap_mode="r")
            if len(array) != n:
                raise ValueError(f"it holds {len(array):,} tokens, its manifest says {n:,}")
            arrays[name] = array
        itos = None
        path = directory / "vocab.txt"
        if path.exists():
            itos = path.read_text(encoding="utf-8").split("\n")[:-1]
        path = directory / MANIFEST
        info, other = manifest["info"], []
        for name, expected in manifest[DIGEST].items():
            path = directory / name
            if (got := file_digest(path)) != expected:
                other.append((path, got, expected))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _Rebuild(
            f"is damaged ({path.name}: {type(e).__name__}: {e}): removing it and preparing the corpus again"
        ) from e
    if other:  # a file that reads, with other content: no damage to repair unasked
        path, got, expected = other[0]
        raise CacheContentError(
            f"corpus cache file {path} is not the file posenc-lab wrote there ({DIGEST} {got[:16]}..., its manifest "
            f"says {expected[:16]}...): something changed it. Delete {directory} to prepare the corpus again"
        )
    return arrays, itos, info


def _other_settings(directory: Path, key: dict) -> bool:
    """True if ``directory`` holds a manifest of other preparation settings (an entry that is replaced)."""
    try:
        return json.loads((directory / MANIFEST).read_text()).get("key") != key
    except (OSError, ValueError, AttributeError):
        return False


def cached(directory: Path, key: dict, build: Callable[[], tuple[dict, list | None, dict]]):
    """Return (arrays per split as memmaps, itos, info), building and saving them on the first call.

    build() -> (arrays {file stem: 1-D array}, itos or None, info: JSON-able facts for the manifest).
    The manifest is written last, so a half-written cache is rebuilt rather than trusted; a damaged one
    is named in a warning, removed and rebuilt. The cache is checked writable before build() runs.
    """
    try:
        found = _read(directory, key)
    except _Rebuild as e:
        log.warning("corpus cache %s %s", directory, e)
        check_writable(directory)
        shutil.rmtree(directory, ignore_errors=True)
        found = None
    if found is not None:
        return found
    check_writable(directory)
    arrays, itos, info = build()
    new = directory  # the outermost folder this call creates: removed again if the entry cannot be written
    while not new.parent.exists():
        new = new.parent
    try:
        if _other_settings(directory, key):  # replaced in place: no reader takes its files for the new ones meanwhile
            (directory / MANIFEST).unlink()
        directory.mkdir(parents=True, exist_ok=True)
        digests = {f"{s}.npy": file_digest(save_npy(directory / f"{s}.npy", a)) for s, a in arrays.items()}
        if itos is not None:
            digests["vocab.txt"] = file_digest(write_text(directory / "vocab.txt", "\n".join(itos) + "\n"))
        n_tokens = {s: len(a) for s, a in arrays.items()}
        write_json(directory / MANIFEST, {"key": key, "info": info, "n_tokens": n_tokens, DIGEST: digests})
    except Exception as e:
        shutil.rmtree(new, ignore_errors=True)  # a full disk keeps no half entry, nor the folders made for it
        if isinstance(e, PosencLabError) or not isinstance(e, OSError):
            raise
        if no_space(e):
            raise disk_full(directory) from e
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
            raise CacheUnwritable(f"cannot write the corpus cache {directory}: {e}") from e
        raise
    return _read(directory, key)


def split_file(name: str, path: Path, sizes) -> dict[str, np.ndarray]:
    """The file's first sizes[0] bytes as train, the next sizes[1] as val, then sizes[2] as test: uint8 arrays
    read from the file (never memmaps of it: a file that shrinks under a memmap kills its reader with SIGBUS)."""
    size = path.stat().st_size
    if len(sizes) != 3 or min(sizes) < 2 or sum(sizes) > size:
        raise ValueError(
            f"{name}: split sizes must be 3 sizes >= 2 bytes summing to <= the size of {path} "
            f"({size:,} bytes), got {tuple(sizes)}"
        )
    cuts = np.cumsum([0, *sizes]).tolist()
    parts = {s: np.fromfile(path, dtype=np.uint8, count=b - a, offset=a) for s, a, b in zip(SPLITS, cuts, cuts[1:])}
    if any(len(part) != b - a for part, a, b in zip(parts.values(), cuts, cuts[1:])):
        raise ValueError(f"{name}: {path} became shorter while it was read; run again once it is complete")
    return parts
