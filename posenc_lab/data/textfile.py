"""textfile: any local file as a byte-level corpus, split by position; documents are chunks of it."""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np

from .cache import DIGEST, cached, key_dir
from .registry import Corpus, register_corpus
from .splits import SPLITS


@register_corpus("textfile", unit="byte")
def load_textfile(
    root: Path, *, path: str | os.PathLike, split: tuple[float, float, float] = (0.9, 0.05, 0.05)
) -> Corpus:
    """Byte-level corpus of one local file, split by position (fractions train/val/test).

    The file is read whole on every load and its content hashed (BLAKE2b) as the cache's key: it is copied into
    the cache on first use, and again when its content changes, whatever its size or modification time say
    (``cp -p`` keeps them; the copy of that path is replaced). Runs read the copy, never the file: a file edited
    or cut short while a run trains leaves that run its data (a memory map of a file that shrinks would kill it
    with SIGBUS), and a run resumed on the changed file is refused by its corpus hash (run.json).
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"textfile corpus: no file at {path} (data.corpus.path)")
    if len(split) != 3 or min(split) <= 0 or sum(split) > 1 + 1e-9:
        raise ValueError(f"textfile corpus: split must be 3 positive fractions summing to <= 1, got {split}")
    size = path.stat().st_size
    sizes = [int(f * size) for f in split]
    if min(sizes) < 2:  # each part needs a token and its target
        need = math.ceil(2 / min(split))
        raise ValueError(
            f"textfile corpus: {path} (data.corpus.path) is too small: {size:,} bytes cannot be split into "
            f"train/val/test by data.corpus.split={list(split)} with 2 bytes or more in each (it takes {need:,}); "
            f"use a larger file"
        )
    text = np.fromfile(path, dtype=np.uint8)  # read once: hashed, and split from these very bytes
    if len(text) != size:
        raise ValueError(f"textfile corpus: {path} changed while it was read; run again once it is complete")
    where = {"path": str(path), "split": list(split)}
    key = {"version": 2, **where, DIGEST: hashlib.new(DIGEST, text).hexdigest()}
    cuts = np.cumsum([0, *sizes]).tolist()
    parts = {s: text[a:b] for s, a, b in zip(SPLITS, cuts, cuts[1:])}
    arrays, _, _ = cached(key_dir(root / "textfile", where), key, lambda: (parts, None, {}))
    return Corpus("textfile", **arrays, vocab_size=256)
