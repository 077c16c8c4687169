"""The cache of prepared corpora: a folder per set of preparation settings, arrays as .npy files read
back as read-only memmaps, and a manifest written last (a half-written cache is rebuilt, never trusted).

A cache file that cannot be read (truncated, corrupted) is named in a warning and the entry is built
again from its source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..io import atomic_path, save_npy, write_json
from .splits import SPLITS

CACHE_ENV = "POSENC_LAB_CACHE"
log = logging.getLogger("posenc_lab.data")
# Caches written before the split vocabulary was one: their "valid" arrays are the val split.
_LEGACY_SPLIT_NAMES = {"valid": "val"}


def cache_root(root: str | os.PathLike | None = None) -> Path:
    """The cache directory: `root` if given, else $POSENC_LAB_CACHE, else ~/.cache/posenc_lab."""
    if root is None:
        root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "posenc_lab"
    return Path(root).expanduser()


def key_dir(base: Path, key: dict) -> Path:
    """A cache directory per set of preparation settings."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return base / digest


def _legacy(name: str) -> str:
    head, dot, rest = name.partition(".")
    return _LEGACY_SPLIT_NAMES.get(head, head) + dot + rest


def _read(directory: Path, key: dict):
    """(arrays, itos, info) of a complete cache entry, None if there is none or it is from other settings;
    ValueError naming the file if the entry is damaged."""
    path = directory / "manifest.json"
    if not path.exists():
        return None
    try:  # ``path``: the file being read, named in the error
        manifest = json.loads(path.read_text())
        if manifest.get("key") != key:
            return None
        arrays = {}
        for name, n in manifest["n_tokens"].items():
            path = directory / f"{name}.npy"
            array = np.load(path, mmap_mode="r")
            if len(array) != n:
                raise ValueError(f"it holds {len(array):,} tokens, its manifest says {n:,}")
            arrays[_legacy(name)] = array
        itos = None
        path = directory / "vocab.txt"
        if path.exists():
            itos = path.read_text(encoding="utf-8").split("\n")[:-1]
        path = directory / "manifest.json"
        return arrays, itos, manifest["info"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path.name}: {type(e).__name__}: {e}") from e


def cached(directory: Path, key: dict, build: Callable[[], tuple[dict, list | None, dict]]):
    """Return (arrays per split as memmaps, itos, info), building and saving them on the first call.

    build() -> (arrays {file stem: 1-D array}, itos or None, info: JSON-able facts for the manifest).
    The manifest is written last, so a half-written cache is rebuilt rather than trusted; a damaged one
    is named in a warning, removed and rebuilt.
    """
    try:
        found = _read(directory, key)
    except ValueError as e:
        log.warning("corpus cache %s is damaged (%s): removing it and preparing the corpus again", directory, e)
        shutil.rmtree(directory, ignore_errors=True)
        found = None
    if found is not None:
        return found
    arrays, itos, info = build()
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        save_npy(directory / f"{name}.npy", array)
    if itos is not None:
        with atomic_path(directory / "vocab.txt") as tmp:
            tmp.write_text("\n".join(itos) + "\n", encoding="utf-8")
    write_json(
        directory / "manifest.json", {"key": key, "info": info, "n_tokens": {s: len(a) for s, a in arrays.items()}}
    )
    return _read(directory, key)


def split_file(name: str, path: Path, sizes) -> dict[str, np.memmap]:
    """The file's first sizes[0] bytes as train, the next sizes[1] as val, then sizes[2] as test:
    read-only uint8 memmaps of the file itself (no copy)."""
    size = path.stat().st_size
    if len(sizes) != 3 or min(sizes) < 2 or sum(sizes) > size:
        raise ValueError(
            f"{name}: split sizes must be 3 sizes >= 2 bytes summing to <= the size of {path} "
            f"({size:,} bytes), got {tuple(sizes)}"
        )
    cuts = np.cumsum([0, *sizes]).tolist()
    return {
        s: np.memmap(path, dtype=np.uint8, mode="r", offset=a, shape=(b - a,))
        for s, a, b in zip(SPLITS, cuts, cuts[1:])
    }
