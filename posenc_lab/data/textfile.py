"""textfile: any local file as a byte-level corpus, split by position; documents are chunks of it."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .cache import split_file
from .registry import Corpus, register_corpus


@register_corpus("textfile", unit="byte")
def load_textfile(
    root: Path, *, path: str | os.PathLike, split: tuple[float, float, float] = (0.9, 0.05, 0.05)
) -> Corpus:
    """Byte-level corpus of one local file, split by position (fractions train/val/test).

    The file itself is memory-mapped, so nothing is cached.
    """
    path = Path(path).expanduser()
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
    regions = split_file("textfile corpus", path, sizes)
    return Corpus("textfile", **regions, vocab_size=256)
