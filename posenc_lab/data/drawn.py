"""A split drawn on the fly instead of read from an array: too long to hold, and no stretch of it read twice.

The split is a sequence of chunks of ``chunk_tokens`` tokens each, chunk c a pure function of c (``draw(c)``, which
seeds its own generator with c): so the tokens at any position are the same whoever asks, in any order, in any
process, and a run resumed at a step reads exactly what the uninterrupted run read there. Side arrays (a loss mask,
the distances) come from the same draw.

It indexes like a 1-D array of ``len`` positions, which is what ``SegmentStream`` cuts into streams (and what sets
the positions a stream's tokens take since its episode began), but it is endless: a position past ``len`` is
another chunk's, never one already read. ``SegmentStream`` reads the i-th pass over the streams at positions
``i * pass_stride + ...`` (``pass_stride``: ``len`` rounded up to whole chunks, so a pass starts a chunk and keeps
its alignment), so a cycling training stream wraps its positions as over an array while every pass reads new
tokens.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

#: chunks each process keeps drawn: a batch of B streams touches at most 2 B of them at a time, so up to 512 streams
#: a process never draws a chunk twice (about 40 KB a chunk of 4,096 tokens)
KEPT_CHUNKS = 1024


class DrawnSplit:
    """A split whose chunk c is ``draw(c)`` = {"tokens": [K], <side array name>: [K], ...} (K = chunk_tokens,
    every array of one chunk as long). ``length``: the positions of one pass (``len``); ``identity``: what decides
    the draws (the options and seeds, JSON values), which stands for its tokens in a run's record. ``draw`` must be
    picklable (DataLoader workers)."""

    ndim = 1

    def __init__(self, draw: Callable[[int], dict[str, np.ndarray]], chunk_tokens: int, length: int, identity: dict):
        if chunk_tokens < 1 or length < 1:
            raise ValueError(f"need chunk_tokens >= 1 and length >= 1, got {chunk_tokens} and {length}")
        self.draw, self.chunk_tokens, self.length, self.identity = draw, chunk_tokens, length, identity
        self.dtype = np.asarray(self._chunk(0)["tokens"]).dtype

    def __len__(self) -> int:
        return self.length

    @property
    def pass_stride(self) -> int:
        """Where the next pass over the streams reads: ``len`` rounded up to whole chunks."""
        return -(-self.length // self.chunk_tokens) * self.chunk_tokens

    def _chunk(self, c: int) -> dict[str, np.ndarray]:
        kept = self.__dict__.setdefault("_kept", OrderedDict())
        if c in kept:
            kept.move_to_end(c)
            return kept[c]
        chunk = self.draw(c)
        if any(len(a) != self.chunk_tokens for a in chunk.values()):
            raise ValueError(f"draw({c}) gave arrays of {sorted({len(a) for a in chunk.values()})} tokens, not the "
                             f"chunk's {self.chunk_tokens}")  # fmt: skip
        kept[c] = chunk
        if len(kept) > KEPT_CHUNKS:
            kept.popitem(last=False)
        return chunk

    def gather(self, index, key: str = "tokens") -> np.ndarray:
        """The ``key`` array at the positions ``index`` (any shape of non-negative integers), that shape."""
        index = np.asarray(index, dtype=np.int64)
        if index.size and index.min() < 0:
            raise IndexError(f"a drawn split has no negative positions, got {int(index.min())}")
        chunks, within = np.divmod(index, self.chunk_tokens)
        out = None
        for c in np.unique(chunks):
            array = self._chunk(int(c))[key]
            out = np.empty(index.shape, dtype=array.dtype) if out is None else out
            here = chunks == c
            out[here] = array[within[here]]
        return np.empty(index.shape, dtype=self.dtype) if out is None else out

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            index = np.arange(start, stop, step)
        return self.gather(index)

    def side(self, key: str) -> DrawnSide:
        """The side array ``key`` of the draws, indexed like the tokens."""
        return DrawnSide(self, key)

    def digest(self) -> str:
        """SHA-256 of the identity: what a run's record keeps in place of the tokens' own hash."""
        return hashlib.sha256(json.dumps(self.identity, sort_keys=True).encode()).hexdigest()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_kept"}  # a worker draws its own chunks


class DrawnSide:
    """One side array of a ``DrawnSplit``: indexes like it."""

    ndim = 1

    def __init__(self, split: DrawnSplit, key: str):
        self.split, self.key = split, key
        self.dtype = np.asarray(split._chunk(0)[key]).dtype

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(len(self.split)))
        return self.split.gather(index, self.key)
