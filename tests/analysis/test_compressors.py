"""The reference compressors: repetition compresses, random bytes do not, and the n-gram model's bits are the
exact cross-entropy of its formula on a case small enough to compute by hand."""

import math

import numpy as np
import pytest

from posenc_lab_analysis.compressors import as_bytes, compress, lzma_bits, ngram_bits, zlib_bits


def test_repetitive_text_compresses_far_below_random_bytes():
    rng = np.random.default_rng(0)
    random = rng.integers(0, 256, 20000)
    repetitive = np.tile(rng.integers(0, 256, 50), 400)
    for bits in (zlib_bits, lzma_bits):
        assert bits(as_bytes(random, 256)) > 7.9  # random bytes do not compress
        assert bits(as_bytes(repetitive, 256)) < 0.5
    # the n-gram model fitted on the repeated block predicts its repetition; on random bytes it cannot beat 8 bits
    assert ngram_bits(repetitive, repetitive, order=3) < 0.1
    assert ngram_bits(random[:10000], random[10000:], order=2) > 7.9


def test_ngram_bits_is_the_exact_cross_entropy_by_hand():
    # train "abab" (symbols 0, 1), vocab 4, order 1; test "ab".
    # order 0: c(a) = 2, c(b) = 2, c() = 4, T() = 2: P0(a) = (2 + 2 / 4) / 6 = 5 / 12, P0(b) = 5 / 12
    # order 1: for "b" after "a": c(a, b) = 2, c(a) = 2 (a is followed by b twice), T(a) = 1:
    # P1(b | a) = (2 + 1 * 5 / 12) / 3 = 29 / 36; the first symbol has no context: P0(a) = 5 / 12
    bits = ngram_bits(np.array([0, 1, 0, 1]), np.array([0, 1]), order=1, vocab=4)
    assert bits == pytest.approx(-(math.log2(5 / 12) + math.log2(29 / 36)) / 2, abs=1e-12)
    # a context never seen in train passes the lower order on: "b" after "c" (unseen) is P0(b) = 5 / 12
    bits = ngram_bits(np.array([0, 1, 0, 1]), np.array([2, 1]), order=1, vocab=4)
    p_c = (0 + 2 / 4) / 6  # order 0 for an unseen symbol: only the uniform share
    assert bits == pytest.approx(-(math.log2(p_c) + math.log2(5 / 12)) / 2, abs=1e-12)


def test_compress_gives_every_figure_and_refuses_what_is_not_bytes():
    text = np.frombuffer(b"def f(x):\n    return x\n" * 50, dtype=np.uint8).astype(np.int64)
    c = compress(text, text, 256, order=2)
    assert c.n_bytes == len(text) and c.order == 2
    assert 0 < c.lzma < 8 and 0 < c.zlib < 8 and 0 < c.ngram < 8
    with pytest.raises(ValueError, match="byte values 0..255, vocab size 1000"):
        compress(text, np.array([300, 2]), 1000)
    with pytest.raises(ValueError, match="order must be an integer >= 0, got -1"):
        ngram_bits(text, text, order=-1)
