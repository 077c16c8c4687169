"""Reference compressors of the held-out text: how many bits per byte a general-purpose compressor, and a simple
byte n-gram model, need for the same text the models are scored on, so a reader sees how far the models are from
using its repetition. Pure Python and numpy; no model here.

- ``zlib`` (level 9, a 32 KB window) and ``lzma`` (preset 9, a window of megabytes): the split's bytes in stream
  order (the files, their separators and their order as the data stream reads them), compressed whole: what
  repetition across that window is worth.
- ``ngram_bits``: an order-k model with Witten-Bell interpolation (PPM's method C, interpolated), fitted on the
  train split and scored on the split: the cross-entropy of

      P_j(x | h_j) = (c(h_j, x) + T(h_j) P_{j-1}(x | h_{j-1})) / (c(h_j) + T(h_j)),   P_{-1}(x) = 1 / V

  where h_j is the j symbols before x, c the train counts, T(h) the number of distinct symbols seen after h (a
  context never seen, c(h) = 0, passes P_{j-1} on unchanged). It uses no repetition within the test text: the
  distance between it and lzma is what a model gains from the document it reads.
"""

from __future__ import annotations

import lzma
import zlib
from dataclasses import asdict, dataclass

import numpy as np

ORDER = 5  # the n-gram model's context (bytes): a fixed small k, PPM's usual best on text


@dataclass(frozen=True)
class Compressed:
    """Bits per byte of one text: ``zlib``, ``lzma``, and the order-``order`` n-gram model fitted on train."""

    n_bytes: int
    zlib: float
    lzma: float
    ngram: float
    order: int

    def as_dict(self) -> dict:
        return asdict(self)


def as_bytes(tokens: np.ndarray, vocab_size: int) -> bytes:
    """The token array of a byte-level split as the bytes it stands for (id = byte value); ValueError otherwise."""
    tokens = np.asarray(tokens)
    if vocab_size > 256 or (tokens.size and (tokens.min() < 0 or tokens.max() > 255)):
        raise ValueError(f"compressors read bytes: the tokens must be byte values 0..255, vocab size {vocab_size}")
    return tokens.astype(np.uint8).tobytes()


def zlib_bits(data: bytes) -> float:
    """Bits per byte of ``data`` compressed by zlib at level 9."""
    return 8.0 * len(zlib.compress(data, 9)) / max(len(data), 1)


def lzma_bits(data: bytes) -> float:
    """Bits per byte of ``data`` compressed by lzma (xz) at preset 9."""
    return 8.0 * len(lzma.compress(data, preset=9)) / max(len(data), 1)


def _keys(x: np.ndarray, j: int, vocab: int) -> np.ndarray:
    """[len(x) - j] the integer of every (j + 1)-gram of ``x``: its j context symbols then the symbol."""
    key = np.zeros(len(x) - j, dtype=np.int64)
    for i in range(j + 1):
        key = key * vocab + x[i : len(x) - j + i]
    return key


def _lookup(table: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's place in the sorted unique ``table``; 0 where the query is not in it."""
    i = np.minimum(np.searchsorted(table, queries), len(table) - 1)
    return np.where(table[i] == queries, values[i], 0)


def ngram_bits(train: np.ndarray, test: np.ndarray, order: int = ORDER, vocab: int = 256) -> float:
    """Bits per symbol of ``test`` [N] under the Witten-Bell interpolated order-``order`` model fitted on ``train``
    (module docstring); the first ``order`` test symbols use the contexts they have. O((N_train + N) order log N)."""
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"the n-gram order must be an integer >= 0, got {order!r}")
    if vocab ** (order + 1) >= 2**62:
        raise ValueError(f"order {order} with {vocab} symbols does not fit the 64-bit keys; use order <= 6 for bytes")
    train, test = np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)
    if len(train) <= order or len(test) < 1:
        raise ValueError(f"the n-gram model needs more than {order} train symbols and a test text, got {len(train)}")
    # level j refines test symbols j, j + 1, ... (the first j have fewer than j symbols before them)
    prob = np.full(len(test), 1.0 / vocab)
    for j in range(order + 1):
        pairs, counts = np.unique(_keys(train, j, vocab), return_counts=True)  # c(h, x) of every (h, x) seen
        contexts, first = np.unique(pairs // vocab, return_index=True)  # sorted: the keys start with the context
        c_h, t_h = np.add.reduceat(counts, first), np.diff(np.append(first, len(pairs)))  # c(h), T(h)
        q = _keys(test, j, vocab)  # the grams of test symbols j, j + 1, ...
        seen_c, seen_t = _lookup(contexts, c_h, q // vocab), _lookup(contexts, t_h, q // vocab)
        lower = prob[j:]
        prob[j:] = np.where(
            seen_c > 0, (_lookup(pairs, counts, q) + seen_t * lower) / np.maximum(seen_c + seen_t, 1), lower
        )
    return float(-np.log2(prob).mean())


def compress(train: np.ndarray, test: np.ndarray, vocab_size: int, order: int = ORDER) -> Compressed:
    """The three figures of a byte-level ``test`` split (tokens [N]) with the n-gram model fitted on ``train``."""
    data = as_bytes(test, vocab_size)
    return Compressed(len(data), zlib_bits(data), lzma_bits(data), ngram_bits(train, test, order), order)
