"""The held-out text section prints the reference compressors' figures of the judged split beside the models',
computes them once per corpus and split, and leaves them out where the corpus is not byte-level."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from posenc_lab.data.registry import Corpus
from posenc_lab_analysis.compressors import compress
from posenc_lab_analysis.dumps import TokenLosses
from posenc_lab_analysis.sections.data import Data, HeldOut, compressed


class FakeRun:
    """What the section reads of a run: its corpus and its name."""

    corpus_name = "planted"

    def __init__(self, corpus: Corpus):
        self._corpus = corpus

    def corpus(self) -> Corpus:
        return self._corpus


def corpus(unit: str = "byte") -> Corpus:
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, 64)
    return Corpus("planted", rng.integers(0, 256, 4000), rng.integers(0, 256, 500), np.tile(block, 40), 256, unit=unit)


def dump(n: int = 64) -> TokenLosses:
    shape = (2, n // 2)
    return TokenLosses(
        np.ones((1, *shape)), np.zeros((1, *shape), bool), np.zeros(shape, int),
        np.repeat([[0], [1]], n // 2, 1), np.ones(shape, bool), np.full(shape, -1), [8], {},
    )  # fmt: skip


def test_the_section_prints_the_compressors_beside_the_models(tmp_path):
    c = corpus()
    logged = []
    figures = compressed(FakeRun(c), "test", tmp_path, logged.append)
    assert figures == compress(c.train, c.test, 256)
    assert figures.lzma < 1 and figures.ngram > 7  # the repeated block: lzma finds it, train's n-grams cannot
    assert compressed(FakeRun(c), "test", tmp_path, logged.append) == figures  # kept: computed once
    assert len(logged) == 1 and len(list(tmp_path.glob("*_test.json"))) == 1

    held = HeldOut(FakeRun(c), dump(), 1, np.zeros(64, bool), np.zeros(64, bool), figures, {"xl:mem8": 2.5})
    ctx = SimpleNamespace(
        shared=SimpleNamespace(split="test"), report=SimpleNamespace(main=SimpleNamespace(figure="bpb"))
    )
    part = Data().render(ctx, held)
    assert f"lzma {figures.lzma:.3f}" in part.text and f"n-gram {figures.ngram:.3f}" in part.text
    table = part.tables[0].df
    assert list(table["bpb"]) == sorted([figures.zlib, figures.lzma, figures.ngram, 2.5])
    assert "model xl:mem8, as trained" in set(table["method"])


def test_no_compressors_for_a_corpus_of_words(tmp_path):
    assert compressed(FakeRun(corpus("word")), "test", tmp_path) is None
    assert not list(tmp_path.iterdir())
