"""textfile: any local file as a byte-level corpus, split by position; documents are chunks of it."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .cache import cached, key_dir, split_file
from .registry import Corpus, register_corpus


@register_corpus("textfile", unit="byte")
def load_textfile(
    root: Path, *, path: str | os.PathLike, split: tuple[float, float, float] = (0.9, 0.05, 0.05)
) -> Corpus:
    """Byte-level corpus of one local file, split by position (fractions train/val/test).

    The file is copied into the cache on first use, and again when its size or modification time changes
    (the copy of that path is replaced). Runs read the copy, never the file: a file edited or cut short
    while a run trains leaves that run its data (a memory map of a file that shrinks would kill it with
    SIGBUS), and a run resumed on the changed file is refused by its corpus hash (run.json).
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"textfile corpus: no file at {path} (data.corpus.path)")
    if len(split) != 3 or min(split) <= 0 or sum(split) > 1 + 1e-9:
        raise ValueError(f"textfile corpus: split must be 3 positive fractions summing to <= 1, got {split}")
    stat = path.stat()
    sizes = [int(f * stat.st_size) for f in split]
    if min(sizes) < 2:  # each part needs a token and its target
        need = math.ceil(2 / min(split))
        raise ValueError(
            f"textfile corpus: {path} (data.corpus.path) is too small: {stat.st_size:,} bytes cannot be split into "
            f"train/val/test by data.corpus.split={list(split)} with 2 bytes or more in each (it takes {need:,}); "
            f"use a larger file"
        )
    where = {"path": str(path), "split": list(split)}
    key = {"version": 1, **where, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    arrays, _, _ = cached(
        key_dir(root / "textfile", where), key, lambda: (split_file("textfile corpus", path, sizes), None, {})
    )
    return Corpus("textfile", **arrays, vocab_size=256)
